"""Guaranteed topics in the router (docs/exactly-once.md, "Embedding it in the router").

An address entry with ``guarantee = "exactly-once"`` (or ``"at-least-once"``) does not go
through the Cython forwarding path: its publisher and subscriber links are endpoint links
(`Link.bind_endpoint`) and every transfer, disposition and settlement on them is an input of
the topic's `qrouter.eo.TopicRouter`. Those inputs, and the outputs that act on the links,
run in the engine (`qrouter/_fast/eo_links.pxi`, the base `EoLinks` of `Guarantees`): each
link carries its entry (`EoPub`, `EoSub`), and no Python frame runs per message on the client
links; what is not per message (attaching, detaching, the group commit, channels, recovery,
ticks) is here.

`Guarantees` holds one `TopicRouter` per topic (the concrete address), created when a link
attaches, a peer speaks about it, or the store holds records of it at start. It applies what the
state machines decide:

* **Group commit.** A `TopicRouter` commits its records at the end of each input and then
  calls its port. Here both are staged: the records of every input of one loop iteration go to
  the store in one transaction, and only then are the outputs (transfers, dispositions,
  inter-router messages) applied, in order. Nothing leaves the router before the records it
  depends on.
* **Channels.** The protocol wants one FIFO channel per pair of routers that loses what was in
  flight when it breaks, both ends being told (docs/exactly-once.md, decision 3). Here a channel
  to router R is the mesh's route to R: messages go in an envelope on the control link to the
  next hop toward R, and every router on the way passes them on. A channel is up while the
  mesh has a route to R. Each envelope carries the channel's epoch and a sequence number:
  a new route, a gap or a reordering resets the channel (`router_down` then `router_up`) under
  a higher epoch, which the other end adopts when it sees it; envelopes of an older epoch are
  dropped. So whatever the mesh does to a message in flight, each end sees a FIFO channel
  that at worst breaks.
* **Links.** A publisher is identified by (container-id, link name) and a subscriber likewise;
  a subscriber attachment gets a fresh id from its `TopicRouter`. The router answers a
  re-attaching link with the unsettled map AMQP 1.0 §2.6.13 asks for, computed from the
  records.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qrouter._fast.codec import Described, UByte, ULong, encode
from qrouter._fast.engine import (
    EoLinks,
    EoPub,
    EoSub,
    Link,
    commit_logged,
    log_entries,
    source_value,
    state_code,
    target_value,
)
from qrouter._fast.eo_core import (
    LogRefs,
    OutQueue,
    RouterOutbox,
    collect_writes,
    commit_memory,
    committed,
    log_records,
    receive_envelopes,
    receive_messages,
    scan_memory,
    stage_writes,
)
from qrouter.eo import EXACTLY_ONCE, AttId, Pub, Sub, TopicRouter
from qrouter.eo.dedup import AcceptedTags
from qrouter.eo.keys import (
    LAYOUT_ESCAPED,
    LAYOUT_KEY,
    RECORDS,
    TOPIC_MARK,
    escape_topic,
    legacy_moves,
    topic_mark,
    topic_prefix,
)
from qrouter.eo.messages import make
from qrouter.eo.records import OriginRecord
from qrouter.journal import origin_id
from qrouter.link_registry import AttachError
from qrouter.store_health import check_injected

if TYPE_CHECKING:
    from qrouter.core import Core

log = logging.getLogger("qrouter.guarantee")

ACCEPTED = 0x24
TERMINAL = (0x24, 0x25, 0x26, 0x27)  # accepted, rejected, released, modified
ACCEPTED_STATE = Described(ULong(ACCEPTED), [])
PUBLISHER_WINDOW = 500  # unaccepted deliveries a publisher may have in flight per link
TICK = 0.25  # seconds between TopicRouter ticks (PING barrier, ASK, timeouts)
MAX_MISMATCHES = 1024  # (router, topic) mismatches remembered, to log each once
GUARANTEES_FILE = "guarantees.json"  # in the journal directory: what the audit verifies  # store: one key per topic with records, to find them at start


@dataclass(eq=False)
class _Channel:
    """The FIFO channel to one other router (see the module doc)."""

    epoch: int
    link_id: int | None = None  # the next hop toward the router; None: unreachable (down)
    out_n: int = 0  # sequence number of the next envelope we send in this epoch
    in_n: int = 0  # the one we expect

    @property
    def up(self) -> bool:
        return self.link_id is not None


class _Port:
    """A topic's `qrouter.eo.Port`: outputs are staged until the iteration's commit. The
    compiled core stages its outputs itself (`EoCore.bind_router`), without calling the
    methods below but `resend` and `log`; the engine applies them (`EoLinks.apply_outputs`)."""

    def __init__(self, g: Guarantees, topic: str) -> None:
        self.g = g
        self.topic = topic
        self.resend_tags: list[bytes] = []

    def _stage(self, name: str, args: tuple[Any, ...]) -> None:
        self.g.outputs.add(name, self.topic, args)
        self.g.schedule()

    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        self._stage("to_router", (router_id, message))

    def deliver(self, att: AttId, out_tag: bytes, body: bytes, resume: bool) -> None:
        self._stage("deliver", (att, out_tag, body, resume))

    def settle_subscriber(self, att: AttId, out_tag: bytes) -> None:
        self._stage("settle_subscriber", (att, out_tag))

    def accept_publisher(self, pub: Pub, tag: bytes) -> None:
        self._stage("accept_publisher", (pub, tag))

    def resend(self, pub: Pub, tags: list[bytes]) -> None:
        self.resend_tags.extend(tags)  # read by attach_publisher for its reply

    def log(self, level: str, msg: str) -> None:
        log.log(logging.getLevelName(level.upper()), "[%s] %s", self.topic, msg)


class _TopicStore:
    """A topic's `qrouter.eo.RecordStore`: commits are staged into the shared batch (the
    compiled core stages its own records in itself, `EoCore.bind_router`: these are for a
    commit from Python)."""

    def __init__(self, g: Guarantees, topic: str) -> None:
        self.g = g
        self.prefix = topic_prefix(topic)  # escaped: no other topic's keys in its range
        self.mark = topic_mark(topic)

    def commit(self, puts: Mapping[bytes, bytes], deletes: Iterable[bytes]) -> None:
        if stage_writes(self.g.loose, self.prefix, puts, None, deletes):
            self.g.loose[self.mark] = b""
        self.g.schedule()

    def commit_records(
        self,
        puts: Mapping[bytes, bytes],
        records: Mapping[bytes, OriginRecord],
        deletes: Iterable[bytes],
    ) -> None:
        """`commit`, with origin records staged as they are: `Guarantees.flush` encodes each
        once per loop iteration, in the state the iteration left it in (the same bytes the
        last of its per-input commits would have written)."""
        if stage_writes(self.g.loose, self.prefix, puts, records, deletes):
            self.g.loose[self.mark] = b""
        self.g.schedule()

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        cut = len(self.prefix)
        for key, value in self.g.backend_scan(self.prefix + prefix):
            yield key[cut:], value


class Guarantees(EoLinks):  # type: ignore[misc]
    """The guaranteed topics of one router (the per-message half: the base, in the engine)."""

    def __init__(self, core: Core, instance: int | None = None) -> None:
        self.core = core
        self.router_id = core.config.id
        self.instance = instance if instance is not None else time.time_ns() // 1_000_000
        self.timeout = core.config.guarantee_timeout
        # the terminus store (qrouter/termini_store.py), None for the memory store
        self.store: Any = getattr(core.persistence, "store", None)
        # the engine's Router whose record log and checkpoint take the records with the
        # durable links' (qrouter/_fast/eo_log.pxi); None: commit to `store` directly (a
        # store without the engine's committer) or keep them in memory (no store)
        engine = getattr(core, "engine", None)
        self.log: Any = (
            engine
            if self.store is not None and getattr(engine, "committer", None) is not None
            else None
        )
        # the numbers its record log gives the records' puts (eo_core.LogRefs): patches and
        # deletes name a record by its number instead of its key
        self.log_refs = LogRefs()
        # the records when there is no store: each topic's by key under its prefix (the
        # cores write them there, `commit_memory`), the rest (the topics' marks) by full key
        self.memory: dict[bytes, bytes] = {}
        self.topic_memory: dict[bytes, dict[bytes, bytes]] = {}
        # a failed commit (qrouter/store_health.py): writes and outputs held until the retry
        self.health: Any = getattr(core.persistence, "health", None)
        self.held = False
        self.topics: dict[str, TopicRouter] = {}
        self.ports: dict[str, _Port] = {}
        self.pubs: dict[tuple[str, Pub], EoPub] = {}
        self.subs: dict[AttId, EoSub] = {}
        self.by_link: dict[Link, EoPub | EoSub] = {}
        self.window = PUBLISHER_WINDOW
        self.channels: dict[str, _Channel] = {}  # router id -> the channel to it
        # the topic cores with records staged for the commit (`collect_writes`); the list
        # stays the same object (each core holds it)
        self.writes: list[TopicRouter] = []
        # writes staged from Python (_TopicStore): bytes, None (delete) or an origin record
        self.loose: dict[bytes, bytes | OriginRecord | None] = {}
        self.outputs = OutQueue()  # staged outputs, in order (EoLinks.apply_outputs)
        self.batches: dict[int, list[dict[str, Any]]] = {}  # next hop -> envelopes to send
        # this iteration's envelope per (router, epoch, next hop): our messages to a router
        # share one envelope, one sequence number ("ms", in order)
        self.groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
        self.scheduled = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None  # set by `topic`: the ticker has work
        self.journal = False  # the delivery journal is on (qrouter/server.py)
        self.dropped = 0  # envelopes from another router that were malformed
        self.journal_dir: str | None = None
        # idempotent publishing: tags accepted lately, per publisher link (qrouter/eo/dedup.py)
        self.accepted_tags = AcceptedTags(self.timeout)
        # (router, topic) it runs with a guarantee we lack: logged once each (bounded)
        self.mismatches: set[tuple[str, str]] = set()
        self.idle_since: dict[str, float] = {}  # topic -> idle (TopicRouter.idle) since
        self.next_att = 0  # the attachment counter of dropped topics, to continue from
        # `_out_to_router` compiled for a message whose envelope is open (qrouter/_fast/eo_core)
        self.outbox = RouterOutbox(self)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Recover the topics the store holds records of, and start ticking."""
        self.loop = asyncio.get_running_loop()
        recover = getattr(self.core.persistence, "recover", None)
        if recover is not None:
            recover()  # a previous run's record log folded into the records first
            # (so the log holds none of the topics' puts: its numbers begin now)
            self.log_refs.begin()
        self._escape_keys()
        for key, _ in list(self.backend_scan(TOPIC_MARK)):
            topic = key[len(TOPIC_MARK) :].decode()
            if self.core.table.guarantee(topic) is None:
                log.warning("store holds records of %r, which has no guarantee now", topic)
            self.topic(topic, create=True)
        if self.topics:
            log.info("guaranteed topics recovered from the store: %s", ", ".join(self.topics))
        self._wake = asyncio.Event()
        self._ticker = self.loop.create_task(self._tick())

    def _escape_keys(self) -> None:
        """A store written before the topics' names were escaped in their keys
        (qrouter/eo/keys.py): the records of the topics whose key changes moved to it, with
        `LAYOUT_KEY`, in one commit, before any topic reads its records. A store that cannot
        take it stops the start: reading the old keys would misread them."""
        if self.store is None or any(k == LAYOUT_KEY for k, _ in self.backend_scan(LAYOUT_KEY)):
            return
        topics = [k[len(TOPIC_MARK) :].decode() for k, _ in self.backend_scan(TOPIC_MARK)]
        moves: dict[bytes, bytes] = {}
        if any(escape_topic(t) != t.encode() for t in topics):
            records = dict(self.backend_scan(RECORDS))
            moves, orphans = legacy_moves(topics, records)
            if orphans:
                log.warning(
                    "store: %d records under eo/ of no topic left as they are, e.g. %r",
                    len(orphans),
                    orphans[0],
                )
            self.loose.update(dict.fromkeys(moves))  # the deletes first: a new key may be
            self.loose.update({new: records[old] for old, new in moves.items()})  # an old one
        self.loose[LAYOUT_KEY] = LAYOUT_ESCAPED
        self.flush()
        if self.held:
            raise RuntimeError("store: cannot write the escaped keys of the guaranteed topics")
        if moves:
            log.warning("store: %d records moved to their topics' escaped keys", len(moves))

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.flush()

    async def _tick(self) -> None:
        assert self._wake is not None
        while True:
            if not (self.topics or self.idle_since or self.accepted_tags.size):
                # Nothing to tick: no guaranteed topic yet, or every one dropped as idle and
                # their publishers' accepted tags expired (tags are added only on a topic's
                # publisher link, and a topic with a link is not idle). Parked until `topic`
                # makes one, rather than waking an idle router, or one that carries only
                # other traffic, four times a second (issue 18; docs/performance.md).
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(TICK)
            now = self.now()
            for topic in list(self.topics.values()):
                topic.tick(now)
            self.accepted_tags.expire(now)
            self._drop_idle(now)

    def _drop_idle(self, now: float) -> None:
        """Forget topics idle for guarantee_timeout (`TopicRouter.idle`): every distinct
        topic ever named would otherwise keep a state machine for the life of the router
        (issue 15 c). A message or a link about it makes it again, from the store."""
        for name, t in list(self.topics.items()):
            if not t.idle():
                self.idle_since.pop(name, None)
            elif now - self.idle_since.setdefault(name, now) >= self.timeout:
                del self.topics[name], self.ports[name], self.idle_since[name]
                self.next_att = max(self.next_att, t.next_att)
                log.info("guaranteed topic %r idle: dropped", name)

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else time.monotonic()

    def guarantee_of(self, address: str) -> str | None:
        return self.core.table.guarantee(address)

    def topic(self, name: str, create: bool = True) -> TopicRouter | None:
        t = self.topics.get(name)
        if t is not None or not create:
            return t
        mode = self.guarantee_of(name) or EXACTLY_ONCE
        port = _Port(self, name)
        store = _TopicStore(self, name)
        t = TopicRouter(
            self.router_id,
            port,
            store,
            instance=self.instance,
            topic=name,
            mode=mode,
            terminus_timeout=self.timeout,
            now=self.now(),
            first_att=self.next_att,  # attachment ids stay unique if it was dropped before
        )
        # the core stages its commits and outputs itself (as _TopicStore and _Port would)
        t.bind_router(self, store.prefix, store.mark)
        self.topics[name] = t
        self.ports[name] = port
        if self._wake is not None:
            self._wake.set()  # the ticker, parked while there was no topic
        now = self.now()
        for router_id in self.up_routers():
            t.router_up(router_id, now)
        log.info("guaranteed topic %r (%s)", name, mode)
        self._note_guarantees()
        return t

    def _new_attachment_id(self, t: TopicRouter) -> AttId:
        """`t.new_attachment_id`, unique among all the router's topics: `subs` (and the
        engine's outputs, which find a subscriber's link there) holds every topic's
        attachments, so two topics' first subscribers must not both be (router, instance, 1):
        the second one's link would take the first one's deliveries."""
        t._next_att = max(t.next_att, self.next_att)
        att: AttId = t.new_attachment_id()
        self.next_att = att[2]
        return att

    def _note_guarantees(self) -> None:
        """The journal directory's guarantees.json names the topics for the audit's verdict."""
        if self.journal_dir is None:
            return
        path = os.path.join(self.journal_dir, GUARANTEES_FILE)
        try:
            try:
                with open(path, encoding="utf-8") as f:
                    noted = dict(json.load(f))  # and the topics dropped since (idle)
            except (OSError, ValueError, TypeError):
                noted = {}
            noted.update({name: t.mode for name, t in self.topics.items()})
            with open(path, "w", encoding="utf-8") as f:
                json.dump(dict(sorted(noted.items())), f, indent=2)
        except OSError as exc:
            log.warning("cannot write %s: %s", path, exc)

    # -- the store and the group commit --------------------------------------------------------

    def backend_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        if self.log is not None:
            # the records as of the last checkpoint, with the net changes logged since
            journal, gone = self.log.journal, self.log.journal_del
            logged = {k: v for k, v in journal.items() if k.startswith(prefix)}
            stored = [
                (k, v) for k, v in self.store.scan(prefix) if k not in logged and k not in gone
            ]
            yield from sorted(stored + list(logged.items()))
        elif self.store is not None:
            yield from self.store.scan(prefix)
        else:
            yield from scan_memory(prefix, self.memory, self.topic_memory)

    def stage(self, apply: Callable[..., None], args: tuple[Any, ...]) -> None:
        """An output to apply after the iteration's commit: `apply(*args)`."""
        self.outputs.call(apply, args)
        if not self.scheduled:
            self.schedule()

    def schedule(self) -> None:
        if not self.scheduled and self.loop is not None:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Commit the iteration's records, then apply the outputs. With a store, they are
        entries of the engine's record log (one append for the iteration, with the durable
        links' changes) kept net until its checkpoint (qrouter/_fast/eo_log.pxi). If the
        commit fails, the records stay (in the log, or here) and every output here, in
        order, until a retry (`retry`, qrouter/store_health.py) commits them: nothing that
        depends on them leaves, and the records the state machines go on from are never lost
        on the way."""
        self.scheduled = False
        if self.held:
            return
        while self.writes or self.loose or self.outputs:
            if self.writes or self.loose:
                # the records the cores staged, each origin record encoded once, in the state
                # the iteration left it in
                if self.log is not None:
                    eng = self.log
                    try:
                        blob = log_records(
                            self.writes,
                            self.loose,
                            eng.journal,
                            eng.journal_del,
                            eng.jborn,
                            self.log_refs,
                        )
                    except Exception as exc:  # noqa: BLE001 - MemoryError, a record it cannot encode
                        # it applies each entry to the net changes as it makes it: those made
                        # before it raised are there and in no append. The next commit is a
                        # checkpoint (of the net changes whole), and until a retry gets past
                        # this point nothing that depends on the records leaves
                        eng.log_broken()
                        self.log_refs.suspend()
                        self._fail(exc)
                        return
                    if blob is not None:
                        log_entries(eng, blob)
                elif self.store is not None:
                    puts, deletes = collect_writes(self.writes, self.loose)
                    try:
                        check_injected()
                        self.store.commit_writes(puts, deletes)
                    except Exception as exc:  # noqa: BLE001 - a full disk, a full map, EIO
                        self._fail(exc)
                        return
                    committed(self.writes)
                else:
                    commit_memory(self.writes, self.loose, self.memory, self.topic_memory)
                self.loose = {}
            if self.log is not None and not commit_logged(self.log):
                # the store failed (the committer reported it): the entries wait in the log
                # for the engine's retry, which runs before ours; the log's numbers are off
                # until its next checkpoint (LogRefs.suspend)
                self.log_refs.suspend()
                self.held = True
                return
            self.apply_outputs(self.outputs)  # in order; one that fails is logged (the engine)
        if self.batches:
            # one control message per next hop and loop iteration, envelopes in order
            batches, self.batches = self.batches, {}
            self.groups.clear()
            self.outbox.forget()
            if self.core.mesh is not None:
                for link_id, envelopes in batches.items():
                    self.core.mesh.send_eo(link_id, envelopes)

    def _fail(self, exc: BaseException) -> None:
        """A commit failed: the records and every output wait for `retry`."""
        self.held = True
        if self.health is not None:
            self.health.failed(exc)
        else:
            log.error("guaranteed topics: store commit failed: %s", exc)

    def retry(self) -> bool:
        """Commit what a failed commit left, then apply the held outputs; True if there was
        something to commit."""
        if not self.held:
            return False
        self.held = False
        self.flush()
        return True

    def _send(self, link_id: int, envelope: dict[str, Any]) -> None:
        self.batches.setdefault(link_id, []).append(envelope)
        self.schedule()

    # -- outputs -------------------------------------------------------------------------------

    def _out_to_router(self, router_id: str, message: dict[str, Any]) -> None:
        ch = self.channels.get(router_id)
        if ch is None or ch.link_id is None or self.core.mesh is None:
            return  # down: lost, as a broken channel loses what it carried
        key = (router_id, ch.epoch, ch.link_id)
        group = self.groups.get(key)
        if group is not None:
            group.append(message)  # the envelope already queued for this iteration
            return
        group = self.groups[key] = [message]
        envelope = {
            "to": router_id,
            "from": self.router_id,
            "e": ch.epoch,
            "n": ch.out_n,
            "ms": group,
        }
        ch.out_n += 1
        self._send(ch.link_id, envelope)

    def _announce_epoch(self, router_id: str, ch: _Channel) -> None:
        """An envelope with no messages in our epoch: its receiver resets into it (`receive`).
        One per iteration at most, and none if one goes to `router_id` this iteration anyway."""
        if ch.link_id is None or self.core.mesh is None:
            return
        key = (router_id, ch.epoch, ch.link_id)
        if key in self.groups:
            return
        self.groups[key] = []
        envelope = {
            "to": router_id,
            "from": self.router_id,
            "e": ch.epoch,
            "n": ch.out_n,
            "ms": self.groups[key],
        }
        ch.out_n += 1
        self._send(ch.link_id, envelope)

    def journal_origin(self, topic: str, out_tag: bytes) -> tuple[str | None, bytes | None]:
        """The journal's origin of a delivery to a subscriber: the publisher's link and tag,
        so rows join across routers (`EoLinks.c_deliver`, only while journaling)."""
        t = self.topics.get(topic)
        origin = t.origin_of(out_tag) if t is not None else None
        if origin is None:
            return None, None
        (container, name), tag = origin
        return origin_id(container, name, b""), tag

    # -- publisher links -----------------------------------------------------------------------

    def attach_publisher(
        self, link: Link, address: str, fields: dict[str, Any], reply: Any
    ) -> None:
        """A producer link to a guaranteed topic: answer its ATTACH with our unsettled map
        (§2.6.13: tags we hold, ACCEPTED where every subscriber accepted; tags we need again
        are left out, so the publisher resends them) and take its deliveries."""
        if self.held or (self.health is not None and not self.health.available):
            self.core.registry.detached(link, True, "link-detach")
            raise AttachError("amqp:resource-limit-exceeded", "store unavailable")
        t = self.topic(address)
        assert t is not None
        pub: Pub = (link.conn.remote_container_id, link.name)
        old = self.pubs.pop((address, pub), None)
        if old is not None:
            self.by_link.pop(old.link, None)
            old.unbind()
        peer_map = _unsettled(fields.get("unsettled"))
        port = self.ports[address]
        port.resend_tags = []
        # receiver-settle-mode as the publisher asks: second (ours), or first (proton's
        # default; we settle with ACCEPTED, which ends the delivery at both ends)
        settle_first = _mode(fields.get("rcv_settle_mode"), 0) == 0
        link.origin_prefix = origin_id(pub[0], pub[1], b"")  # the journal's origin
        link.journal_address = address
        p = EoPub(self, pub, address, link, settle_first)
        self.pubs[(address, pub)] = p
        self.by_link[link] = p
        # no map at all (null, as proton always sends): it cannot resume, so its unsettled
        # deliveries wait for it to resend them with the same tags (idempotent publishing)
        resumable = fields.get("unsettled") is not None
        t.publisher_attached(pub, list(peer_map.items()), self.now(), resumable=resumable)
        resend = set(port.resend_tags)
        # accept_publisher outputs of this attach are staged: read them for the reply map
        accepted = self.outputs.accepting(pub)
        ours = {
            tag: (ACCEPTED_STATE if tag in accepted else None)
            for tag in peer_map
            if tag not in resend
        }
        link.attach(
            {
                "snd_settle_mode": UByte(_mode(fields.get("snd_settle_mode"), 2)),
                "rcv_settle_mode": UByte(0 if settle_first else 1),
                "source": source_value(fields["source"])
                if isinstance(fields.get("source"), dict)
                else None,
                "target": target_value(reply),
                "unsettled": ours or None,
            }
        )
        link.bind_endpoint()
        p.bind()  # its deliveries go to the engine's EoPub, not to on_message
        link.flow(PUBLISHER_WINDOW)
        log.debug("[C%d] publisher %r on guaranteed %r", link.conn.conn_id, pub, address)

    # -- subscriber links ----------------------------------------------------------------------

    def attach_subscriber(
        self, link: Link, address: str, fields: dict[str, Any], reply: Any, durable: int
    ) -> None:
        """A consumer link of a guaranteed topic. It can resume (our client) when its terminus
        keeps unsettled state (durable 2); then its unsettled map is reconciled with the
        records and our map echoes its tags, so that it keeps them until we settle them."""
        if self.held or (self.health is not None and not self.health.available):
            self.core.registry.detached(link, True, "link-detach")
            raise AttachError("amqp:resource-limit-exceeded", "store unavailable")
        t = self.topic(address)
        assert t is not None
        sub: Sub = (link.conn.remote_container_id, link.name)
        for old in [x for x in self.subs.values() if x.topic == address and x.sub == sub]:
            # the same subscriber again (its old link was stolen): that attachment ended
            self.subs.pop(old.att, None)
            self.by_link.pop(old.link, None)
            old.unbind()
            t.subscriber_detached(old.att, False, self.now())
        peer_map = _unsettled(fields.get("unsettled")) if t.eo else {}
        resumable = durable == 2
        att = self._new_attachment_id(t)
        link.journal_address = address
        s = EoSub(self, att, sub, address, link, resumable)
        self.subs[att] = s
        self.by_link[link] = s
        target = fields.get("target")
        link.attach(
            {
                "snd_settle_mode": UByte(0),  # unsettled: every delivery gets an outcome
                "rcv_settle_mode": UByte(1 if t.eo else 0),
                "source": source_value(reply),
                "target": target_value(target) if isinstance(target, dict) else None,
                "unsettled": {tag: None for tag in peer_map} or None,
            }
        )
        link.bind_endpoint()
        s.bind()  # its outcomes go to the engine's EoSub, not to on_outcome
        t.subscriber_attached(sub, list(peer_map.items()), self.now(), att, resumable=resumable)
        log.debug("[C%d] subscriber %r on guaranteed %r", link.conn.conn_id, sub, address)

    # -- link events (qrouter/core.py) ----------------------------------------------------------

    def owns(self, link: Link) -> bool:
        return link in self.by_link

    # The engine hands a bound link's deliveries to its entry (`Link.eo`, eo_links.pxi); these
    # do the same for a caller in Python (qrouter/core.py's handler, for a link not bound).
    def on_message(self, link: Link, d: Any, payload: bytes) -> None:
        entry = self.by_link.get(link)
        if isinstance(entry, EoPub):
            entry.transfer(d)

    def on_settled(self, link: Link, d: Any) -> None:
        entry = self.by_link.get(link)
        if isinstance(entry, EoPub):
            entry.settled(d)

    def on_outcome(self, link: Link, d: Any, code: int, settled: bool) -> None:
        entry = self.by_link.get(link)
        if isinstance(entry, EoSub):
            entry.outcome(d, code, settled)

    def on_detach(self, link: Link, closed: bool) -> None:
        entry: Any = self.by_link.pop(link, None)
        if entry is None:
            return
        entry.unbind()
        now = self.now()
        t = self.topics.get(entry.topic)
        if isinstance(entry, EoPub):
            key, pub = entry.key, entry.pub
            if self.pubs.get(key) is entry:
                del self.pubs[key]
                if t is not None:
                    t.publisher_detached(pub, closed, now)
        else:
            self.subs.pop(entry.att, None)
            if t is not None:
                t.subscriber_detached(entry.att, closed, now)

    # -- the mesh (qrouter/inter_router.py) -----------------------------------------------------

    def up_routers(self) -> list[str]:
        return sorted(rid for rid, ch in self.channels.items() if ch.up)

    def route(self, router_id: str, link_id: int | None) -> None:
        """The mesh's next hop toward `router_id` changed (None: unreachable)."""
        ch = self.channels.get(router_id)
        now = self.now()
        # compact records go to a router only while it is its own next hop: a router on the
        # way decodes the batches it passes on, which one before them cannot (eo_wire.pxi)
        peers = getattr(self.core.mesh, "peers", None) or {}  # (tests' meshes may have none)
        peer = peers.get(link_id) if link_id is not None else None
        if peer is not None and getattr(peer, "router_id", None) == router_id:
            self.outbox.direct.add(router_id)
        else:
            self.outbox.direct.discard(router_id)
        if link_id is None:
            if ch is not None and ch.up:
                log.info("guaranteed topics: channel to %r down (no route)", router_id)
                ch.link_id = None
                self.outbox.forget()
                for t in list(self.topics.values()):
                    t.router_down(router_id, now)
            return
        if ch is None:
            # a first epoch above any a previous run of ours used with this router
            ch = self.channels[router_id] = _Channel(epoch=time.time_ns() // 1_000_000)
        elif ch.link_id == link_id:
            return
        else:
            if ch.up:
                for t in list(self.topics.values()):
                    t.router_down(router_id, now)  # a new route: what was in flight may be lost
            ch.epoch += 1
        log.info(
            "guaranteed topics: channel to %r via [C%d], epoch %d", router_id, link_id, ch.epoch
        )
        self._open(router_id, ch, link_id, now)

    def _open(self, router_id: str, ch: _Channel, link_id: int, now: float) -> None:
        ch.link_id = link_id
        ch.out_n = ch.in_n = 0
        self.outbox.forget()  # its next message opens an envelope in the new epoch / route
        for t in list(self.topics.values()):
            t.router_up(router_id, now)

    def _reset(self, router_id: str, ch: _Channel, epoch: int) -> None:
        """Break the channel and open it again under `epoch`."""
        assert ch.link_id is not None
        now = self.now()
        for t in list(self.topics.values()):
            t.router_down(router_id, now)
        ch.epoch = epoch
        self._open(router_id, ch, ch.link_id, now)

    def receive_batch(self, envelopes: Any) -> None:
        """A control message of envelopes (one per next hop and loop iteration)."""
        if not isinstance(envelopes, list):
            self.dropped += 1
            log.warning("undecodable guaranteed-topic batch dropped")
            return
        # ours, in sequence: straight to the topics (compiled); the rest through receive
        receive_envelopes(self, envelopes, self.now())

    def _lacking(self, src: str, topic: str, op: Any) -> None:
        """`src` runs the protocol for a topic we have no guarantee for (a configuration
        mismatch, issue 15 b): answer its PINGs with LACKING, so that its barrier stops
        waiting for us and it reports the mismatch; no state is made for the topic here."""
        if (src, topic) not in self.mismatches and len(self.mismatches) < MAX_MISMATCHES:
            self.mismatches.add((src, topic))
            log.error(
                "router %r runs topic %r with a guarantee, which this router does not have: "
                "configure the same address entry on every router",
                src,
                topic,
            )
        if op == "PING":
            self._out_to_router(src, make("LACKING", topic))

    def receive(self, envelope: Any) -> None:
        """An envelope from the control link: ours, or to pass on toward its router."""
        if not isinstance(envelope, dict):
            self.dropped += 1
            log.warning("undecodable guaranteed-topic envelope dropped")
            return
        get = envelope.get
        to, src, e, n = get("to"), get("from"), get("e"), get("n")
        if not (isinstance(to, str) and isinstance(src, str)):
            self.dropped += 1
            log.warning("guaranteed-topic envelope without to/from dropped")
            return
        if to != self.router_id:
            mesh = self.core.mesh
            hop = mesh.next_hop.get(to) if mesh is not None else None
            if hop is not None:
                self._send(hop, envelope)  # relayed as it came: order kept hop by hop
            return
        ch = self.channels.get(src)
        if ch is None or not ch.up or not isinstance(e, int) or not isinstance(n, int):
            return  # no route back (yet): the channel opens, and re-synchronises, with it
        if e < ch.epoch:
            # from before a reset: tell the sender our epoch, or a router that has nothing
            # to say to it (no topic state here) would leave it in the old epoch for ever
            self._announce_epoch(src, ch)
            return
        if e > ch.epoch:
            # the other end reset the channel: so do we, in its epoch; it starts at 0
            self._reset(src, ch, e)
        if n != ch.in_n:
            # a gap or a reordering: break the channel
            log.info("guaranteed topics: channel to %r reset (got #%d, not #%d)", src, n, ch.in_n)
            self._reset(src, ch, ch.epoch + 1)
            return
        ch.in_n += 1
        messages = envelope.get("ms")
        if messages is None:
            messages = [envelope.get("m")]  # one message: a router before "ms"
        elif not isinstance(messages, list):
            messages = [None]
        # the per-message records go straight to their topic's core (compiled); the rest
        # comes back to receive_one
        receive_messages(self, src, messages, self.now())

    def receive_one(self, src: str, message: Any, now: float) -> None:
        """One message of an envelope that `receive_messages` does not take itself: a map (the
        control ops, or a router before the records), a record for a topic not made here, or
        something malformed (None: a record that did not decode)."""
        if isinstance(message, dict):
            name, op = message.get("topic"), message.get("op")
        elif isinstance(message, tuple) and len(message) >= 2:
            name, op = message[1], message[0]
        else:
            name = op = None
        if not isinstance(name, str):
            self.dropped += 1
            log.warning("undecodable guaranteed-topic message from %r dropped", src)
            return
        t = self.topics.get(name)
        if t is None:
            if self.guarantee_of(name) is None:
                self._lacking(src, name, op)
                return
            if op in ("PING", "PONG"):
                # nothing here about the topic (dropped idle, or never made): everything
                # we sent on this channel before has arrived, so PONG at once; no state
                if op == "PING" and isinstance(message, dict) and isinstance(message.get("e"), int):
                    self._out_to_router(src, make("PONG", name, e=message["e"]))
                return
            t = self.topic(name)
            assert t is not None
        t.receive(src, message, now)


def _unsettled(value: Any) -> dict[bytes, bool]:
    """A peer's unsettled map as tag -> has a terminal state (for us: it saw / gave accepted)."""
    out: dict[bytes, bool] = {}
    if not isinstance(value, dict):
        return out
    for tag, state in value.items():
        if not isinstance(tag, bytes) or len(tag) > 32:
            continue
        code = state_code(encode(state)) if state is not None else 0
        out[tag] = code in TERMINAL
    return out


def _mode(value: Any, default: int) -> int:
    if value is None or not 0 <= int(value) <= 2:
        return default
    return int(value)
