from typing import NamedTuple

class Permissions:
    READ: int
    WRITE: int
    CREATE: int
    DELETE: int
    ADMIN: int
    ALL: int

class Id(NamedTuple):
    scheme: str
    id: str

class ACL(NamedTuple):
    perms: int
    id: Id

OPEN_ACL_UNSAFE: list[ACL]
CREATOR_ALL_ACL: list[ACL]
READ_ACL_UNSAFE: list[ACL]

def make_digest_acl_credential(username: str, password: str) -> str: ...
def make_acl(
    scheme: str,
    credential: str,
    read: bool = False,
    write: bool = False,
    create: bool = False,
    delete: bool = False,
    admin: bool = False,
    all: bool = False,
) -> ACL: ...
def make_digest_acl(
    username: str,
    password: str,
    read: bool = False,
    write: bool = False,
    create: bool = False,
    delete: bool = False,
    admin: bool = False,
    all: bool = False,
) -> ACL: ...
