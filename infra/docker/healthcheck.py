"""Container health check for every tock process type, standard library only.

The timer and consumers serve GET /healthz on TOCK_HEALTH_PORT; the dashboard serves it on
TOCK_DASHBOARD_PORT. The image sets both, and one container runs one process, so the check
asks each port in turn: the first that accepts a connection decides (200 = healthy); a
refused connection means "not this process type", and the next port is tried.

Exit status 0 = healthy, 1 = unhealthy (the Docker/ECS HEALTHCHECK contract).
"""

from __future__ import annotations

import http.client
import os
import sys

TIMEOUT_SECONDS = 3.0


def candidate_ports(env: dict[str, str]) -> list[int]:
    """Ports to ask, in order; malformed values are skipped."""
    ports = []
    for name, default in (("TOCK_HEALTH_PORT", ""), ("TOCK_DASHBOARD_PORT", "8080")):
        raw = env.get(name, default).strip()
        if raw.isdigit() and 0 < int(raw) < 65536 and int(raw) not in ports:
            ports.append(int(raw))
    return ports


def check(ports: list[int], host: str = "127.0.0.1") -> tuple[bool, str]:
    """(healthy, explanation) from the first port that accepts a connection."""
    for port in ports:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT_SECONDS)
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
        except ConnectionRefusedError:
            continue
        except OSError as exc:
            return False, f"port {port}: {exc}"
        finally:
            conn.close()
        return status == 200, f"port {port}: HTTP {status}"
    return False, f"nothing listening on {ports}"


def main() -> int:
    healthy, why = check(candidate_ports(dict(os.environ)))
    if not healthy:
        print(f"unhealthy: {why}", file=sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
