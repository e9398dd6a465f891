"""Seed the fuzz corpus from real conversations: ``python -m tests.fuzz.capture``.

Real clients talk to a real router (``tests.harness.Router``, from this checkout) through a
recording TCP proxy on loopback; what each connection sent becomes seeds:

* python-qpid-proton (BlockingConnection: ANONYMOUS and SASL PLAIN, send / receive with
  accept / reject / release, a multi-frame message, a dynamic receiver), qrouter-tool's
  management client (``$management`` requests), router.client (our asyncio client, also
  exactly-once), oslo.messaging's AMQP 1.0 driver (RPC call and cast, a notification), and two
  routers of a mesh (the proxy between the connector and the inter-router listener), with a
  guaranteed topic so exactly-once control messages cross too;
* each client-to-router byte stream is a ``connection`` seed; the same after its protocol
  header(s), SASL frames and OPEN is a ``session`` seed (targets.SESSION_PRELUDE replaces them);
* each message a TRANSFER carried (either direction, frames joined) is a ``message`` seed; those
  with an ``operation`` application-property are ``management`` seeds; the control-link
  messages between the two routers, concatenated per connection and direction (and in short
  runs), are ``interrouter`` seeds.

The corpus is small on purpose (tests/fuzz/test_corpus.py replays all of it in CI); a
campaign's inputs can be folded in with ``python -m tests.fuzz.run --target T --merge``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import selectors
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from qrouter._fast.codec import DecodeError, Described, decode

from tests.harness import HOST, MeshRouter, Router, free_port, retry

OUT = Path(__file__).resolve().parent / "corpus"
MAX_SEED = 32768  # libFuzzer's -max_len for the engine targets (run.py)


class Recorder:
    """A loopback TCP proxy to `upstream` recording each connection's bytes both ways."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.label = "none"
        self.streams: list[tuple[str, bytearray, bytearray]] = []  # label, to server, to client
        self._lsock = socket.create_server((HOST, self.port))
        self._lsock.setblocking(False)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="recorder")
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._lsock, selectors.EVENT_READ, None)
        while not self._stop:
            for key, _ in sel.select(0.1):
                if key.data is None:
                    client, _addr = self._lsock.accept()
                    server = socket.create_connection((HOST, self.upstream))
                    up, down = bytearray(), bytearray()
                    self.streams.append((self.label, up, down))
                    sel.register(client, selectors.EVENT_READ, (server, up))
                    sel.register(server, selectors.EVENT_READ, (client, down))
                    continue
                peer, record = key.data
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if data:
                    record += data
                    try:
                        peer.sendall(data)
                    except OSError:
                        data = b""
                if not data:
                    for s in (key.fileobj, peer):
                        try:
                            sel.unregister(s)
                        except (KeyError, ValueError):
                            pass
                        s.close()  # type: ignore[union-attr]
        sel.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self._lsock.close()

    @contextmanager
    def scenario(self, label: str) -> Iterator[str]:
        self.label = label
        yield f"amqp://{HOST}:{self.port}"
        time.sleep(0.3)  # let the last bytes cross


# --- scenarios ----------------------------------------------------------------------------------


def proton_blocking(url: str, user: str | None = None) -> None:
    from proton import Message
    from proton.utils import BlockingConnection

    kw: dict[str, Any] = {"timeout": 10}
    if user:
        kw.update(user=user, password="secret", allowed_mechs="PLAIN", allow_insecure_mechs=True)
    else:
        kw.update(allowed_mechs="ANONYMOUS")
    conn = BlockingConnection(url, **kw)
    try:
        rcv = conn.create_receiver("cap/q", name="cap-rcv", credit=10)
        snd = conn.create_sender("cap/q", name="cap-snd")
        # link.send: BlockingSender.send would wait for an outcome only our receiver gives
        snd.link.send(
            Message(
                body={"k": [1, 2.5, None, True], "b": b"\x00\x01"},
                id="m-1",
                subject="s",
                reply_to="cap/reply",
                correlation_id=7,
                properties={"a": 1, "s": "x"},
                annotations={"x-opt-a": "v"},
                durable=True,
                priority=6,
                ttl=30,
                content_type="application/json",
            )
        )
        snd.link.send(Message(body=b"\xff" * 9000))  # several frames at max-frame-size 4096
        snd.link.send(Message(body="third"))
        for outcome in ("accept", "reject", "release"):
            rcv.receive(timeout=10)
            getattr(rcv, outcome)()
        dyn = conn.create_receiver(None, dynamic=True, credit=1)
        conn.create_sender(dyn.link.remote_source.address).link.send(Message(body="to dynamic"))
        dyn.receive(timeout=10)
        dyn.accept()
    finally:
        conn.close()


def management(url: str) -> None:
    from tests.tools_alias import alias_tools_package

    alias_tools_package()
    from qrouter_tools.management_client import ConnectOptions, ManagementClient

    client = ManagementClient(ConnectOptions(url=url, timeout=10))
    try:
        client.request("GET-TYPES")
        client.request("QUERY", "connection", body={"attributeNames": []})
        client.request("QUERY", "address", body={"attributeNames": ["prefix", "distribution"]})
        client.request(
            "CREATE", "address", name="cap", body={"prefix": "cap/", "distribution": "multicast"}
        )
        client.request("READ", "address", name="cap")
        client.request("UPDATE", "address", name="cap", body={"distribution": "balanced"})
        client.request("DELETE", "address", name="cap")
        client.request("READ", "router")
        client.request("QUERY", "link", body={"attributeNames": ["name", "address"]})
    finally:
        client.close()


def our_client(url: str) -> None:
    from qrouter.client import Client
    from qrouter.message import Message

    async def main() -> None:
        async with await Client.connect(url, "capture-client") as c:
            rcv = await c.receiver("cap/c", "cap-c-in", credit=10)
            snd = await c.sender("cap/c", "cap-c-out")
            futures = [snd.submit(Message(body=f"m{i}", subject="s")) for i in range(3)]
            for _ in range(3):
                rec = await rcv.receive(timeout=10)
                assert rec is not None
                await rec.accept()
            await asyncio.gather(*futures)
            ercv = await c.receiver("cap/eo", "cap-eo-in", exactly_once=True)
            esnd = await c.sender("cap/eo", "cap-eo-out", exactly_once=True)
            fut = esnd.submit(Message(body=b"once", application_properties={"n": 1}))
            rec = await ercv.receive(timeout=10)
            assert rec is not None
            await rec.accept()
            await fut
            await rec.wait_settled(10)

    asyncio.run(main())


def oslo(url: str) -> None:
    from tests.interop.test_oslo_messaging import Oslo

    env = Oslo(url + "/", "dynamic")
    try:
        env.rpc_server("cap-server")
        client = env.client(timeout=10)
        client.call({}, "echo", value=42)
        client.cast({}, "record", value="cast")
        listener = env.notification_listener("cap-notify")
        import oslo_messaging

        notifier = oslo_messaging.Notifier(
            env.notification_transport(), "cap.host", driver="messaging", topics=["cap-notify"]
        )
        notifier.info({}, "cap.event", {"x": 1})
        listener.seen.get(timeout=10)
    finally:
        env.close()


# --- streams to seeds ---------------------------------------------------------------------------


def split_stream(data: bytes) -> tuple[int, list[tuple[int, int, bytes]]]:
    """(offset just after OPEN, [(frame type, channel, body)]) of a client-to-router stream."""
    pos, after_open = 0, 0
    frames: list[tuple[int, int, bytes]] = []
    while pos + 8 <= len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        if size < 8 or pos + size > len(data):
            break
        doff, ftype = data[pos + 4], data[pos + 5]
        channel = int.from_bytes(data[pos + 6 : pos + 8], "big")
        body = data[pos + doff * 4 : pos + size]
        pos += size
        frames.append((ftype, channel, body))
        if not after_open and ftype == 0 and body[:3] == b"\x00\x53\x10":
            after_open = pos
    return after_open, frames


def transfers(frames: list[tuple[int, int, bytes]]) -> list[bytes]:
    """The messages the TRANSFER frames carried, multi-frame deliveries joined (2.6.14)."""
    out: list[bytes] = []
    partial: dict[tuple[int, Any], bytearray] = {}
    for ftype, channel, body in frames:
        if ftype != 0 or not body:
            continue
        try:
            value, end = decode(body)
        except DecodeError:
            continue
        if not isinstance(value, Described) or int(value.descriptor) != 0x14:
            continue
        fields = value.value
        handle = fields[0]
        more = len(fields) > 5 and bool(fields[5])
        buf = partial.setdefault((channel, handle), bytearray())
        buf += body[end:]
        if not more:
            out.append(bytes(partial.pop((channel, handle))))
    return out


def is_management(payload: bytes) -> bool:
    from qrouter.message import decode_message

    try:
        m = decode_message(payload)
    except DecodeError:
        return False
    return bool(m.application_properties and "operation" in m.application_properties)


def is_control(payload: bytes) -> bool:
    """A mesh or guaranteed-topic control message: one AMQP value, a map with op and v."""
    try:
        value, end = decode(payload)
    except DecodeError:
        return False
    v = value.value if isinstance(value, Described) else value
    return end == len(payload) and isinstance(v, dict) and "op" in v


class Corpus:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.count: dict[str, int] = {}

    def add(self, target: str, name: str, data: bytes) -> None:
        if not data or len(data) > MAX_SEED:
            return
        d = self.root / target
        d.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha1(data).hexdigest()[:12]
        if any(d.glob(f"*-{digest}.bin")):
            return
        (d / f"{name}-{digest}.bin").write_bytes(data)
        self.count[target] = self.count.get(target, 0) + 1

    def streams(self, label: str, up: bytes, down: bytes) -> None:
        if up:
            self.add("connection", label, up)
        after_open, frames = split_stream(up)
        if after_open:
            self.add("session", label, up[after_open:])
        for direction, stream, fr in (("up", up, frames), ("down", down, split_stream(down)[1])):
            del stream
            payloads = transfers(fr)
            control = [p for p in payloads if is_control(p)]
            for p in payloads:
                if p in control:
                    continue
                self.add("message", label, p)
                if is_management(p):
                    self.add("management", label, p)
            for i in range(0, len(control), 6):
                self.add("interrouter", f"{label}-{direction}", b"".join(control[i : i + 6]))
            if control:
                self.add("interrouter", f"{label}-{direction}-all", b"".join(control)[:MAX_SEED])


def capture(root: Path) -> dict[str, int]:
    corpus = Corpus(root)
    with tempfile.TemporaryDirectory(prefix="qrouter-capture-") as tmp:
        d = Path(tmp)
        users = d / "users"
        from qrouter.auth import hash_password

        users.write_text(f"capture:{hash_password('secret', iterations=1)}\n")
        r = Router(
            d,
            "capture",
            listeners=[{"max_frame_size": 4096}],
            config={"users_file": str(users)},
        )
        rec = Recorder(r.port)
        scenarios: list[tuple[str, Callable[[str], None]]] = [
            ("proton-anonymous", proton_blocking),
            ("proton-plain", lambda url: proton_blocking(url, user="capture")),
            ("qrouter-tool", management),
            ("router-client", our_client),
            ("oslo", oslo),
        ]
        try:
            for label, fn in scenarios:
                try:
                    with rec.scenario(label) as url:
                        fn(url)
                except ImportError as exc:
                    print(f"{label}: skipped ({exc})")
            mesh(d, corpus)
        finally:
            rec.close()
            r.stop()
        for label, up, down in rec.streams:
            corpus.streams(label, bytes(up), bytes(down))
    return corpus.count


def _pump(conn: Any, seconds: float = 0.5) -> None:
    """Let a BlockingConnection do its I/O for a while (it only does it inside its calls)."""
    from proton import Timeout

    try:
        conn.wait(lambda: False, timeout=seconds)
    except Timeout:
        pass


def mesh(d: Path, corpus: Corpus) -> None:
    """Two routers, B connecting to A's inter-router port through the recorder, with a
    guaranteed topic: mesh control messages and exactly-once envelopes cross it."""
    from proton import Message
    from proton.utils import BlockingConnection

    addresses = {"gt/": "multicast,exactly-once"}
    a = MeshRouter(d, "A", addresses=addresses)
    rec = Recorder(a.inter_port)
    rec.label = "mesh"
    b = MeshRouter(d, "B", connect=[rec.port], addresses=addresses)
    try:
        rb = BlockingConnection(b.url, timeout=10)
        ra = BlockingConnection(a.url, timeout=10)
        try:
            sub = rb.create_receiver("gt/t", name="cap-gt-sub", credit=10)
            plain = rb.create_receiver("cap/mesh", name="cap-mesh-sub", credit=10)

            def routed() -> bool:
                snd = ra.create_sender("cap/mesh", name=f"cap-mesh-pub-{time.monotonic()}")
                ok = snd.credit > 0 or bool(snd.link.credit)
                snd.close()
                return ok

            retry(routed, timeout=20)
            ra.create_sender("cap/mesh", name="cap-mesh-pub").link.send(
                Message(body="over the mesh")
            )
            _pump(ra)
            plain.receive(timeout=10)
            plain.accept()
            pub = ra.create_sender("gt/t", name="cap-gt-pub")
            for i in range(3):
                pub.link.send(Message(body=f"guaranteed {i}"))
                _pump(ra)
                sub.receive(timeout=10)
                sub.accept()
            time.sleep(1.5)  # a hello or two more
        finally:
            rb.close()
            ra.close()
    finally:
        b.stop()
        a.stop()
        rec.close()
    for label, up, down in rec.streams:
        corpus.streams(label, bytes(up), bytes(down))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    print(capture(args.out))


if __name__ == "__main__":
    main()
