"""
A proposer's network: its sandbox gets an empty network namespace whose one way out is Egress, an allow-listed proxy
outside it reached through a Unix socket (the shape of Claude Code's own sandbox runtime: bubblewrap plus a proxy
outside it), itself bounded: EGRESS_CONNECTIONS at once, EGRESS_HEAD_S to send a request head of at most
EGRESS_HEAD_BYTES, the first EGRESS_REFUSED_KEPT refused endpoints recorded.

    from lib.episodes.egress import Egress, through_egress
    egress = Egress(folder, endpoints)                       # listens on folder/egress.sock
    argv, env, sock = through_egress(argv, egress)           # argv under BRIDGE, HTTPS_PROXY set for it
    argv = sandbox.wrap(argv, env=env, ro=[sock], ...)       # the socket bound into the sandbox
    egress.refused, egress.refusals                          # what it refused
    egress.close()

Egress connects a name only where every address it resolves to is public (public(): never the host's loopback, a
private or link-local network, nor an IPv6 form that embeds one); an endpoint configured as a literal local address is
reached as given, and only that host and port. Used by lib/proposers.py for the claude proposer's API.
"""
import inspect
import os
import socket
import threading
import time

from lib.episodes.sandbox import python

# Runs inside the sandbox as the command's parent: it serves HTTPS_PROXY on the sandbox's own loopback (and each
# fixed tunnel on its port there), forwarding every connection to the Unix socket of the Egress proxy outside;
# then runs the command and exits with its status. PUMP stands for this module's own pump, whose source
# through_egress writes in its place: the script runs in the sandbox's bare Python, where the module cannot be imported.
BRIDGE = r"""
import os, socket, subprocess, sys, threading
sock_path, proxy_port, tunnels, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5:]

PUMP

def serve(listener, target):
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX)
        try:
            upstream.connect(sock_path)
            if target:  # a fixed tunnel: the proxy is asked for target, its answer read before the client talks
                upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 4096:
                    chunk = upstream.recv(1)
                    if not chunk:
                        break
                    head += chunk
                if b" 200 " not in head.split(b"\r\n", 1)[0]:
                    raise OSError(head[:200])
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()

routes = [(int(spec.split("=")[0]), spec.split("=", 1)[1]) for spec in filter(None, tunnels.split(","))]
for port, target in [(proxy_port, None), *routes]:  # listening before the command starts
    threading.Thread(target=serve, args=(socket.create_server(("127.0.0.1", port)), target), daemon=True).start()
rc = subprocess.call(argv)
sys.exit(128 - rc if rc < 0 else rc)  # a signal as a shell reports it
"""
PROXY_PORT = 3128  # HTTPS_PROXY inside the sandbox (its own loopback)


def endpoint_of(url):
    """(host, port) of a URL (https: 443, http: 80 unless given)."""
    from urllib.parse import urlsplit
    parts = urlsplit(url if "//" in url else "//" + url)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return (parts.hostname or "").lower(), port


def public(address):
    """Whether an IP address is on the public internet: not the host's loopback, a private or link-local network
    (a cloud's metadata service), multicast, reserved, unspecified or IPv6 site-local, nor an IPv6 address that
    embeds such an IPv4 one (mapped, compatible, translated, NAT64, 6to4, Teredo), which a host may route to it."""
    import ipaddress
    ip = ipaddress.ip_address(address.split("%")[0])
    found = [ip]
    if ip.version == 6:
        if ip.is_site_local or ip in ipaddress.ip_network("64:ff9b:1::/48"):  # fec0::/10; RFC 8215's local NAT64
            return False
        # ::a.b.c.d (compatible), ::ffff:a.b.c.d (mapped), ::ffff:0:a.b.c.d (translated), 64:ff9b::a.b.c.d (NAT64)
        if int(ip) >> 32 in (0, 0xFFFF, 0xFFFF0000) or ip in ipaddress.ip_network("64:ff9b::/96"):
            found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        found += [v4 for v4 in (ip.sixtofour, *(ip.teredo or ())) if v4 is not None]
    return all(a.is_global and not a.is_multicast for a in found)


# the proxy's own bounds: what a proposer flooding it from inside its sandbox can make the search hold
EGRESS_CONNECTIONS = 64  # connections at once (each: its thread and, once through, one more); past it: closed
EGRESS_HEAD_S = 10.0     # to send a request head, from the connection's start
EGRESS_HEAD_BYTES = 65536
EGRESS_REFUSED_KEPT = 20  # distinct refused endpoints recorded (each cut at 200 characters); the rest only counted


class Egress:
    """The proxy outside the sandbox: CONNECT host:port (and plain http://host:port/... requests) for the
    allowed endpoints only, each name resolved here and connected only where every address it resolves to is
    public. An endpoint the user configured as a literal loopback or private address (a local server) is
    allowed as given, and only that host and port. Everything else gets 403, recorded in `refused` (the first
    EGRESS_REFUSED_KEPT distinct ones) and counted in `refusals`. At most EGRESS_CONNECTIONS connections at once,
    each with EGRESS_HEAD_S to send its request head: a flood costs the search a bounded number of threads and
    bytes."""

    def __init__(self, folder, endpoints):
        self.allowed = {endpoint_of(e) for e in endpoints}
        self.path = os.path.join(folder, "egress.sock")
        self.refused, self.refusals = [], 0
        self.slots = threading.BoundedSemaphore(EGRESS_CONNECTIONS)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen(64)
        threading.Thread(target=self.serve, daemon=True, name="whale-egress").start()

    def tunnels(self):
        """Fixed tunnels for endpoints on a literal address (a local server the client reaches directly, not
        through HTTPS_PROXY): 'port=host:port,...' for the bridge."""
        return ",".join(f"{port}={host}:{port}" for host, port in sorted(self.allowed) if literal(host))

    def serve(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            if not self.slots.acquire(blocking=False):  # at its bound: this one is closed unanswered
                client.close()
                continue
            threading.Thread(target=self.handle_in_slot, args=(client,), daemon=True).start()

    def handle_in_slot(self, client):
        try:
            self.handle(client)
        finally:
            self.slots.release()

    def refuse(self, endpoint):
        self.refusals += 1
        if len(self.refused) < EGRESS_REFUSED_KEPT and endpoint[:200] not in self.refused:
            self.refused.append(endpoint[:200])

    def handle(self, client):
        """One connection, to its end: its head read within EGRESS_HEAD_S, then both directions pumped (one on a
        thread of its own, one on this one), so the connection holds its slot until it closes."""
        try:
            head, end = b"", time.time() + EGRESS_HEAD_S
            while b"\r\n\r\n" not in head:
                client.settimeout(max(end - time.time(), 0.001))
                chunk = client.recv(4096)
                if not chunk or len(head) > EGRESS_HEAD_BYTES:
                    return client.close()
                head += chunk
            client.settimeout(None)
            line, rest = head.split(b"\r\n", 1)
            method, target, version = line.decode("latin-1").split(" ", 2)
            if method == "CONNECT":
                host, port = endpoint_of("//" + target)
            else:
                host, port = endpoint_of(target)
            upstream = self.connect(host, port)
            if upstream is None:
                self.refuse(f"{host}:{port}")
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return client.close()
            if method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                upstream.sendall(head.split(b"\r\n\r\n", 1)[1])
            else:  # origin-form to the server; every later request on this connection goes to the same server
                from urllib.parse import urlsplit
                parts = urlsplit(target)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                upstream.sendall(f"{method} {path} {version}\r\n".encode("latin-1") + rest)
        except (OSError, ValueError, UnicodeError):
            return client.close()
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()
        for s in (client, upstream):
            s.close()

    def connect(self, host, port):
        """A socket to an allowed endpoint, or None."""
        if (host, port) not in self.allowed:
            return None
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return None
        if not literal(host) and not all(public(info[4][0]) for info in infos):
            return None  # a name that resolves to the host's loopback or a private network is not its endpoint
        for family, kind, proto, _, address in infos:
            try:
                return socket.create_connection(address[:2], timeout=30)
            except OSError:
                continue
        return None

    def close(self):
        self.server.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def literal(host):
    import ipaddress
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host == "localhost"


def pump(a, b):
    """Bytes from a to b until either side closes, then both shut: one direction of a connection, on the Egress
    proxy's side and (in BRIDGE) on the sandbox's."""
    try:
        while data := a.recv(65536):
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def through_egress(argv, egress):
    """argv run under the bridge (inside the sandbox), with the proxy variables set for it: -> (argv, env,
    the socket to bind into the sandbox)."""
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    env = {name: proxy for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy")}
    env.update(NO_PROXY="", no_proxy="")
    bridge = BRIDGE.replace("\nPUMP\n", "\n" + inspect.getsource(pump))
    return ([python(), "-I", "-c", bridge, egress.path, str(PROXY_PORT), egress.tunnels(), "--", *argv], env,
            egress.path)

