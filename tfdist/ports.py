"""Free ports for the tasks of a local cluster (``tfdist launch``), on the host they bind."""

from __future__ import annotations

import socket

from tfdist.errors import LaunchError

DEFAULT_HOST = "127.0.0.1"
MAX_PORT = 65535
_PORT_TRIES = 1000


def free_ports(count: int, *, host: str, port_base: int | None, avoid: set[int]) -> list[int]:
    """``count`` distinct ports free on ``host``, none of them in ``avoid``: any the kernel
    gives, or consecutive ones from ``port_base``. Raises LaunchError naming the flag to change."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise LaunchError(
            f"--host cannot be resolved ({e.strerror}); received --host {host!r}. "
            f"Fix: pass --host {DEFAULT_HOST} or an address of this machine."
        ) from None
    bind_host = sockaddr[0]
    ports: list[int] = []
    if port_base is None:
        held = []
        try:
            for _ in range(_PORT_TRIES):
                if len(ports) == count:
                    break
                sock = socket.socket(family, socket.SOCK_STREAM)
                held.append(sock)  # held open until all are chosen, so the kernel gives distinct ones
                sock.bind((bind_host, 0))
                port = sock.getsockname()[1]
                if port not in avoid:
                    ports.append(port)
        except OSError as e:
            raise LaunchError(
                f"--host cannot be bound ({e.strerror}); received --host {host!r}. "
                f"Fix: pass --host {DEFAULT_HOST} or an address of this machine."
            ) from None
        finally:
            for sock in held:
                sock.close()
    else:
        port = port_base
        while len(ports) < count and port <= MAX_PORT:
            if port not in avoid and _is_free(family, bind_host, port):
                ports.append(port)
            port += 1
    if len(ports) < count and port_base is not None:
        raise LaunchError(
            f"--port-base leaves too few free ports: {len(ports)} of the {count} needed are free between "
            f"{port_base} and {MAX_PORT} on {host} (ports of earlier restarts are not reused); "
            f"received --port-base {port_base}. "
            f"Fix: pass a lower --port-base, or leave it out to use any free ports."
        )
    if len(ports) < count:
        raise LaunchError(
            f"only {len(ports)} of the {count} ports needed could be found free on --host {host!r}. "
            f"Fix: free some ports, or pass --port-base with a range of free ports."
        )
    return ports


def _is_free(family: int, host: str, port: int) -> bool:
    """True if ``port`` can be bound now (a port in TIME_WAIT cannot without SO_REUSEADDR)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
