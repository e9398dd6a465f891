# Guaranteed topics' records through the router's record log (qrouter/guarantee.py,
# `Guarantees.flush`). (Included by engine.pyx.)
#
# A guaranteed topic's records (origin records b"eo/<topic>/o/<tag>", their bodies
# b"eo/<topic>/m/<tag>", subscriber claims, the topic's mark b"eot/<topic>") go where the
# durable links' records go (durable.pxi): each loop iteration's changes are log entries in
# `Router.jlog`, appended to the store's record log by the group commit before any output
# that depends on them, and kept net in `Router.journal` / `journal_del` until the
# checkpoint, which commits them to the records in one transaction with the durable links'
# and empties the log. One log and one checkpoint for both writers: the checkpoint empties
# the log, so everything the log held must be in the net changes it commits, whoever wrote it.
#
# A record made and deleted within one checkpoint interval (almost every message's) is in
# `Router.jborn` while it lives, so its delete only drops it from the net changes: it never
# reaches the B-tree (LMDB) or levels (LevelDB).


def log_writes(Router r, dict puts, set deletes, set born):
    """One commit of the guaranteed topics (`collect_writes`: disjoint puts and deletes) as
    log entries of this iteration and net changes until the checkpoint. `born`: keys of
    `puts` the store cannot hold (made in this commit). Needs the store's committer."""
    cdef dict journal = r.journal
    cdef set gone = r.journal_del
    cdef set jborn = r.jborn
    if r.committer is None:
        raise RuntimeError("the router has no record log (memory store)")
    for key in deletes:
        jlog_entry(r, LOG_DEL, <bytes>key, None)
        if journal:
            journal.pop(key, None)
        if jborn and key in jborn:
            jborn.discard(key)  # made since the checkpoint: the records never see it
        else:
            gone.add(key)
    for key, value in puts.items():
        jlog_entry(r, LOG_PUT, <bytes>key, <bytes>value)
        journal[key] = value
        if gone and key in gone:
            # deleted earlier in the interval: the records may hold the old one
            gone.discard(key)
        elif born is not None and key in born:
            jborn.add(key)


def commit_logged(Router r):
    """The group commit of the log entries pending (or the checkpoint, when due), now. True
    once they are durable; False if the store is failing: they stay, and the output that
    depends on them waits for `Router.retry_commit` (qrouter/store_health.py)."""
    if r.store_down:
        return False
    if r.jlog_n or r.ckpt_failed:
        return r.try_commit(r.ckpt_failed)
    return True
