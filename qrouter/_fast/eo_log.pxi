# Guaranteed topics' records through the router's record log (qrouter/guarantee.py,
# `Guarantees.flush`). (Included by engine.pyx.)
#
# A guaranteed topic's records (origin records b"eo/<escaped topic>/o/<tag>", their bodies
# b"eo/<escaped topic>/m/<tag>", subscriber claims, the topic's mark b"eot/<topic>": the
# escape, qrouter/eo/keys.py, keeps every topic's range free of others' keys) go where the
# durable links' records go (durable.pxi): each loop iteration's changes are log entries in
# `Router.jlog`, appended to the store's record log by the group commit before any output
# that depends on them, and kept net in `Router.journal` / `journal_del` until the
# checkpoint, which commits them to the records in one transaction with the durable links'
# and empties the log. One log and one checkpoint for both writers: the checkpoint empties
# the log, so everything the log held must be in the net changes it commits, whoever wrote it.
#
# A record made and deleted within one checkpoint interval (almost every message's) says so
# while it lives (an origin record in its own fields, `OriginRecord._lo_new`, other keys in
# `Router.jborn`), so its delete only drops it from the net changes: it never reaches the
# B-tree (LMDB) or levels (LevelDB).


def log_entries(Router r, bytes blob not None):
    """Record-log entries of the guaranteed topics' commit (`eo_core.log_records`, which
    applied them to `journal`, `journal_del` and `jborn` already): appended to this
    iteration's, for the group commit (`commit_logged`). Needs the store's committer."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(blob)
    if r.committer is None:
        raise RuntimeError("the router has no record log (memory store)")
    if not n:
        return
    if r.jlog_n == 0:
        # the iteration's only entries so far (the usual case: the durable links wrote none):
        # kept as they are and handed to the committer whole, not copied into `jlog` and out
        # again (two copies of every record's bytes); an entry made after them copies them in
        # first (jlog_reserve)
        r.jlog_blob = blob
        r.jlog_n = n
        return
    memcpy(jlog_reserve(r, r.jlog_n + n), PyBytes_AS_STRING(blob), n)
    r.jlog_n += n


def commit_logged(Router r):
    """The group commit of the log entries pending (or the checkpoint, when due), now. True
    once they are durable; False if the store is failing: they stay, and the output that
    depends on them waits for `Router.retry_commit` (qrouter/store_health.py)."""
    if r.store_down:
        return False
    if r.jlog_n or r.ckpt_failed:
        return r.try_commit(r.ckpt_failed)
    return True
