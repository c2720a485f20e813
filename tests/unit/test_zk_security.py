"""The ACL of each kind of node, and the pause node's ACL derived from the base's as the server shows it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kazoo.security import ACL, Id, Permissions

from coordinator.store.zk_security import digest_identity, node_acls, parse_identity, pause_acl, same_acl

AGENT = digest_identity("coordinator", "a")
OPERATOR = digest_identity("operator", "o")
READER = Id("x509", "O=example,CN=reader")
ANYONE = Id("world", "anyone")


def perms(acl: tuple[ACL, ...] | list[ACL]) -> dict[Id, int]:
    return {entry.id: entry.perms for entry in acl}


def masked(ident: Id) -> Id:
    return Id("digest", ident.id.split(":")[0] + ":x") if ident.scheme == "digest" else ident


def test_each_role_gets_what_it_needs_and_nobody_else_anything() -> None:
    acls = node_acls([AGENT], [OPERATOR], [READER])
    assert perms(acls.default) == {AGENT: Permissions.ALL, OPERATOR: Permissions.READ, READER: Permissions.READ}
    assert perms(acls.base)[OPERATOR] == Permissions.READ | Permissions.CREATE | Permissions.DELETE
    assert perms(acls.pause) == {AGENT: Permissions.ALL, OPERATOR: Permissions.ALL, READER: Permissions.READ}
    assert perms(acls.ancestors) == {AGENT: Permissions.ALL, ANYONE: Permissions.READ | Permissions.CREATE}
    base = "/r/g"
    assert acls.for_path("/r", base) == acls.ancestors
    assert acls.for_path(base, base) == acls.base
    assert acls.for_path("/r/g/pause", base) == acls.pause
    assert acls.for_path("/r/g/drains", base) == acls.base  # operators create and delete its children
    assert acls.for_path("/r/g/drains/vm0", base) == acls.pause
    assert acls.for_path("/r/g/drains-admitted/vm0", base) == acls.default  # only the budget admits a drain
    assert acls.for_path("/r/g/events/E/acks/vm0", base) == acls.default
    assert acls.for_path("/r/g/events", base) == acls.default
    assert acls.for_path("/r/group2", base) == acls.ancestors  # a sibling is not below the base


def test_an_identity_in_two_roles_gets_the_wider_one_once() -> None:
    acls = node_acls([AGENT], [AGENT, OPERATOR], [OPERATOR, READER])
    assert perms(acls.default) == {AGENT: Permissions.ALL, OPERATOR: Permissions.READ, READER: Permissions.READ}
    assert len(acls.default) == 3
    with pytest.raises(ValueError, match="at least one agent identity"):
        node_acls([])


def test_the_pause_acl_follows_the_base_and_resolves_masked_digests_from_known_identities() -> None:
    base = node_acls([AGENT], [OPERATOR], [READER]).base
    assert perms(pause_acl(base)) == perms(node_acls([AGENT], [OPERATOR], [READER]).pause)  # as an agent sees it
    shown_to_operator = [ACL(e.perms, masked(e.id)) for e in base]
    resolved = pause_acl(shown_to_operator, [AGENT, OPERATOR])
    assert perms(resolved) == perms(node_acls([AGENT], [OPERATOR], [READER]).pause)
    # Without the agents' identity, the agents must still be able to read the pause: anyone may read it.
    partial = perms(pause_acl(shown_to_operator, [OPERATOR]))
    assert partial == {OPERATOR: Permissions.ALL, READER: Permissions.READ, ANYONE: Permissions.READ}
    open_base = [ACL(Permissions.ALL, ANYONE)]
    assert perms(pause_acl(open_base)) == {ANYONE: Permissions.ALL}


def test_a_masked_acl_is_the_same_as_the_configured_one_by_user() -> None:
    wanted = node_acls([AGENT], [OPERATOR]).default
    assert same_acl(wanted, wanted)
    assert same_acl([ACL(e.perms, masked(e.id)) for e in wanted], wanted)
    assert not same_acl([ACL(Permissions.ALL, ANYONE)], wanted)
    assert not same_acl([ACL(Permissions.ALL, e.id) for e in wanted], wanted)  # operator's perms widened


@pytest.mark.parametrize("text", ["digest", "digest:", "kerberos:x", "world:everyone", "digest:user:short",
                                  "digest:us:er:" + "A" * 27 + "="])
def test_malformed_identities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="identity"):
        parse_identity(text)


def test_zk_digest_prints_the_identity_from_standard_input_and_never_takes_the_password_as_argument() -> None:
    result = subprocess.run([sys.executable, "-m", "coordinator", "zk-digest", "operator"], input="o\n",
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"digest:{OPERATOR.id}"
    assert parse_identity(result.stdout.strip()) == OPERATOR
    empty = subprocess.run([sys.executable, "-m", "coordinator", "zk-digest", "operator"], input="\n",
                           capture_output=True, text=True, timeout=60, check=False)
    assert empty.returncode == 2 and "empty password" in empty.stderr
