"""qrouter/policy.py without a router: parsing ([policy] and policy_file), the management role
table, ${user} substitution, and the log rate limiter. The rules against real routers and
proton clients are in tests/interop/test_policy.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qrouter.config import ConfigError, load_config
from qrouter.policy import ConnInfo, Policy, parse_policy


def info(user: str | None, listener: str = "127.0.0.1", require_auth: bool = False) -> ConnInfo:
    return ConnInfo(1, user, "127.0.0.1", listener, require_auth)


def admitted(policy: Policy, user: str | None, **kw: object) -> ConnInfo:
    ci = info(user, **kw)  # type: ignore[arg-type]
    assert policy.admit(ci) is None
    return ci


GROUPS = {
    "group": [
        {"name": "apps", "users": ["alice", "a.b", "x*"], "sources": ["q.${user}.#", "pub"]},
        {"name": "anon", "users": ["$anonymous"], "management": "admin"},
        {"name": "ops", "users": ["root"], "management": "admin"},
    ]
}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"colour": 1}, "policy.colour: unknown key"),
        ({"group": [{"users": ["a"]}]}, "policy.group[0].name: missing"),
        ({"group": [{"name": "g", "bogus": 1}]}, "policy.group[0].bogus: unknown key"),
        (
            {"group": [{"name": "g", "users": ["a"]}, {"name": "h", "users": ["a"]}]},
            "policy.group[1].users: user 'a' is also in group 'g'",
        ),
        ({"group": [{"name": "g"}, {"name": "g"}]}, "policy.group[1].name: a group named 'g'"),
        ({"group": [{"name": "g", "sources": ["a*"]}]}, "policy.group[0].sources[0]:"),
        ({"group": [{"name": "g", "max_senders": -1}]}, "policy.group[0].max_senders: -1"),
        ({"group": [{"name": "g", "max_sessions": 70000}]}, "max_sessions: 70000 is out of"),
        ({"group": [{"name": "g", "management": "root"}]}, "'root' is not one of"),
        ({"allow_unknown_user": True}, "policy.allow_unknown_user: needs default_group"),
        ({"default_group": "nope"}, "policy.default_group: no [[policy.group]] named 'nope'"),
        ({"management_users": {"a": "god"}}, "policy.management_users.a: 'god' is not one of"),
    ],
)
def test_bad_policies_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy(table)
    assert message in str(exc.value)


def test_policy_table_or_file_not_both(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[group]]\nname = "g"\nusers = ["u"]\n')
    inline = tmp_path / "inline.toml"
    inline.write_text('[policy]\nallow_unknown_user = false\n[[policy.group]]\nname = "x"\n')
    assert load_config(str(inline)).policy.groups[0].name == "x"  # type: ignore[union-attr]
    cfg = load_config(None, policy_file=str(policy))
    assert cfg.policy is not None and cfg.policy.groups[0].users == ("u",)
    with pytest.raises(ConfigError, match="either a \\[policy\\] table or policy_file"):
        load_config(str(inline), policy_file=str(policy))
    broken = tmp_path / "broken.toml"
    broken.write_text('[[group]]\nname = "g"\nmax_senders = "many"\n')
    with pytest.raises(ConfigError, match=r"broken.toml: policy.group\[0\].max_senders"):
        load_config(None, policy_file=str(broken))


def test_user_substitution_never_widens() -> None:
    p = Policy(parse_policy(GROUPS), users_file=True)
    alice = admitted(p, "alice")
    assert p.check_attach(alice, True, "q.alice.x", False) is None
    assert p.check_attach(alice, True, "q.alice", False) is None  # '#': zero or more tokens
    assert p.check_attach(alice, True, "q.bob.x", False) is not None
    assert p.check_attach(alice, True, "pub", False) is None
    assert p.check_attach(alice, True, "pub.sub", False) is not None  # a literal is exact
    # a name with a wildcard gets nothing from ${user} patterns (it would match others')
    star = admitted(p, "x*")
    assert p.check_attach(star, True, "q.anything.x", False) is not None
    assert p.check_attach(star, True, "pub", False) is None
    # an anonymous connection gets nothing from ${user} patterns either
    p2 = Policy(
        parse_policy({"group": [{"name": "g", "users": ["$anonymous"], "sources": ["${user}"]}]}),
        users_file=False,
    )
    anon = admitted(p2, None)
    assert p2.check_attach(anon, True, "None", False) is not None


@pytest.mark.parametrize(
    ("policy", "users_file", "user", "listener", "require_auth", "role"),
    [
        # no policy: the embedded default is admin, anything else monitor
        (None, False, None, "127.0.0.1", False, "admin"),
        (None, False, None, "::1", False, "admin"),
        (None, False, None, "0.0.0.0", False, "monitor"),
        (None, False, None, "192.0.2.7", False, "monitor"),
        (None, True, None, "127.0.0.1", False, "monitor"),
        (None, True, "alice", "127.0.0.1", True, "monitor"),
        # a policy: the group's role ...
        (GROUPS, True, "root", "0.0.0.0", True, "admin"),
        (GROUPS, True, "alice", "127.0.0.1", False, "none"),
        (GROUPS, False, None, "127.0.0.1", False, "admin"),
        # ... but anonymous is never admin beside authentication or beyond loopback
        (GROUPS, True, None, "127.0.0.1", True, "monitor"),
        (GROUPS, False, None, "0.0.0.0", False, "monitor"),
    ],
)
def test_management_roles(
    policy: dict[str, object] | None,
    users_file: bool,
    user: str | None,
    listener: str,
    require_auth: bool,
    role: str,
) -> None:
    p = Policy(parse_policy(policy) if policy is not None else None, users_file=users_file)
    ci = info(user, listener, require_auth)
    assert p.admit(ci) is None
    assert p.management_role(ci) == role


def test_management_users_override_the_group() -> None:
    table = dict(GROUPS, management_users={"root": "monitor", "alice": "admin"})
    p = Policy(parse_policy(table), users_file=True)
    assert p.management_role(admitted(p, "root")) == "monitor"
    assert p.management_role(admitted(p, "alice")) == "admin"


def test_refusal_log_is_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    p = Policy(parse_policy(dict(GROUPS, log_interval=3600)), users_file=True)
    alice = admitted(p, "alice")
    with caplog.at_level(logging.WARNING, logger="qrouter.policy"):
        for _ in range(50):
            assert p.check_attach(alice, False, "nowhere", False) is not None
        assert p.check_attach(alice, True, "nowhere", False) is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "qrouter.policy"]
    assert len(lines) == 2, lines  # one per (connection, rule)
    assert p.refusals[("apps", "targets")] == 50 and p.refusals[("apps", "sources")] == 1
    # a new connection logs again
    other = ConnInfo(2, "alice", "127.0.0.1", "127.0.0.1", False)
    assert p.admit(other) is None
    with caplog.at_level(logging.WARNING, logger="qrouter.policy"):
        p.check_attach(other, False, "nowhere", False)
    assert len([r for r in caplog.records if r.name == "qrouter.policy"]) == 3


def test_counts_follow_release() -> None:
    table = {"group": [{"name": "g", "users": ["u"], "max_connections_per_user": 2}]}
    p = Policy(parse_policy(table), users_file=True)
    first, second = admitted(p, "u"), admitted(p, "u")
    refusal = p.admit(info("u"))
    assert refusal is not None and refusal.condition == "amqp:resource-limit-exceeded"
    p.release(first)
    p.release(first)  # twice: counted once
    third = admitted(p, "u")
    assert p.per_user["u"] == 2 and p.per_group["g"] == 2
    p.release(second)
    p.release(third)
    assert not p.per_user and not p.per_group and not p.per_host
