"""PVE's access objects for the stand-in host: roles, users, API tokens and ACL entries that are kept, as
PVE keeps them, for the calls the Proxmox provider (bpg v0.111.1: `RoleLegacy`, `UserLegacy`, `user.Token`,
`Acl`) makes. fakepve 0.5.0 answers these from its catch-all and keeps nothing (an ACL read after a PUT
would not find the entry), so a mixin of the stand-in answers them instead.

As PVE 9 (PVE/API2/Role.pm, User.pm, TokenAPI, ACL.pm): role privileges come back as `{"VM.Audit": 1}`;
a missing role is `role 'X' does not exist`, a missing user `no such user ('x@pve')`, a missing token
`no token 'n' for user 'u'` (each a 500); a role id may not start with `PVE`; a token's secret is
answered once, at its creation, and the token can then log in; an ACL entry gives its principal the role's
privileges on the path (and below it, with propagate). fakepve checks each call's own privileges from
PVE's schema before a handler runs.

Unlike PVE: propagate off still applies below the path (fakepve's `allowed` has no notion of it), and
privilege separation does not narrow a token to its user's privileges.
"""

from __future__ import annotations

import uuid

from fakepve import shapes
from fakepve.model import PveError
from fakepve.routing import split_list


def _missing(message: str) -> PveError:
    return PveError(500, message)


class PveAccessObjects:
    """Mixin of the stand-in (a FakePve): `roles`, `pve_users`, `user_tokens` and `acl_entries` as PVE stores
    them; `_routes_stand_in_access` registers their handlers (fakepve's own `_routes_access` stays)."""

    def _init_access_objects(self) -> None:
        self.roles: dict[str, set[str]] = {}
        self.pve_users: dict[str, dict] = {}
        self.user_tokens: dict[str, dict] = {}  # "user@realm!name" -> {comment, expire, privsep}
        self.acl_entries: list[dict] = []  # {path, roleid, type, ugid, propagate}
        self._acl_granted: dict[str, list] = {}  # what the entries granted in `acl`, rebuilt on every change

    def _routes_stand_in_access(self):
        return [
            ("POST", "/access/roles", self._role_create),
            ("GET", "/access/roles/{roleid}", self._role_read),
            ("PUT", "/access/roles/{roleid}", self._role_update),
            ("DELETE", "/access/roles/{roleid}", self._role_delete),
            ("POST", "/access/users", self._user_create),
            ("GET", "/access/users/{userid}", self._user_read),
            ("PUT", "/access/users/{userid}", self._user_update),
            ("DELETE", "/access/users/{userid}", self._user_delete),
            ("POST", "/access/users/{userid}/token/{tokenid}", self._token_create),
            ("GET", "/access/users/{userid}/token/{tokenid}", self._token_read),
            ("PUT", "/access/users/{userid}/token/{tokenid}", self._token_update),
            ("DELETE", "/access/users/{userid}/token/{tokenid}", self._token_delete),
            ("GET", "/access/acl", self._acl_list),
            ("PUT", "/access/acl", self._acl_update),
        ]

    # --- roles -------------------------------------------------------------------------------------

    def role_privileges(self, roleid: str) -> set[str]:
        if roleid in shapes.ROLES:
            return set(shapes.ROLES[roleid])
        if roleid not in self.roles:
            raise _missing(f"role '{roleid}' does not exist")
        return set(self.roles[roleid])

    async def _role_create(self, v, user):
        roleid = v["roleid"]
        if roleid.lower().startswith("pve"):
            raise PveError(400, "Parameter verification failed.", {"roleid": "cannot use reserved role name"})
        if roleid in self.roles or roleid in shapes.ROLES:
            raise PveError(500, f"create role failed: role '{roleid}' already exists")
        self.roles[roleid] = self._privileges(v.get("privs"))
        return None

    async def _role_read(self, v, user):
        return dict.fromkeys(sorted(self.role_privileges(v["roleid"])), 1)

    async def _role_update(self, v, user):
        self.role_privileges(v["roleid"])
        privs = self._privileges(v.get("privs"))
        self.roles[v["roleid"]] = (self.roles[v["roleid"]] | privs) if v.get("append") else privs
        self._reapply_acl()
        return None

    async def _role_delete(self, v, user):
        self.role_privileges(v["roleid"])
        del self.roles[v["roleid"]]
        self.acl_entries = [e for e in self.acl_entries if e["roleid"] != v["roleid"]]
        self._reapply_acl()
        return None

    @staticmethod
    def _privileges(text) -> set[str]:
        privs = set(split_list(text))
        unknown = sorted(privs - set(shapes.PRIVILEGES))
        if unknown:
            raise PveError(400, "Parameter verification failed.", {"privs": f"invalid privilege '{unknown[0]}'"})
        return privs

    # --- users -------------------------------------------------------------------------------------

    _USER_FIELDS = ("comment", "email", "firstname", "lastname", "keys")

    def _user(self, userid: str) -> dict:
        if userid not in self.pve_users:
            raise _missing(f"no such user ('{userid}')")
        return self.pve_users[userid]

    async def _user_create(self, v, user):
        userid = v["userid"]
        if userid in self.pve_users:
            raise PveError(500, f"create user failed: user '{userid}' already exists")
        record = {"enable": int(v.get("enable", 1)), "expire": int(v.get("expire") or 0),
                  "groups": split_list(v.get("groups"))}
        record.update({k: v[k] for k in self._USER_FIELDS if v.get(k)})
        self.pve_users[userid] = record
        return None

    async def _user_read(self, v, user):
        record = dict(self._user(v["userid"]))
        record["tokens"] = [{"tokenid": key.split("!", 1)[1], **token} for key, token in self.user_tokens.items()
                            if key.split("!", 1)[0] == v["userid"]]
        return record

    async def _user_update(self, v, user):
        record = self._user(v["userid"])
        for key in self._USER_FIELDS:
            if key in v:
                if v[key]:
                    record[key] = v[key]
                else:
                    record.pop(key, None)
        if "enable" in v:
            record["enable"] = int(v["enable"])
        if "expire" in v:
            record["expire"] = int(v["expire"] or 0)
        if v.get("groups"):
            record["groups"] = split_list(v["groups"])
        return None

    async def _user_delete(self, v, user):
        userid = v["userid"]
        self._user(userid)
        del self.pve_users[userid]
        # PVE deletes the user's tokens and every ACL entry of the user and its tokens.
        for key in [k for k in self.user_tokens if k.split("!", 1)[0] == userid]:
            del self.user_tokens[key]
            self.apitokens.pop(key, None)
        self.acl_entries = [e for e in self.acl_entries if e["ugid"].split("!", 1)[0] != userid]
        self._reapply_acl()
        return None

    # --- API tokens --------------------------------------------------------------------------------

    def _token(self, userid: str, tokenid: str) -> dict:
        self._user(userid)
        key = f"{userid}!{tokenid}"
        if key not in self.user_tokens:
            raise _missing(f"no token '{tokenid}' for user '{userid}'")
        return self.user_tokens[key]

    async def _token_create(self, v, user):
        userid, tokenid = v["userid"], v["tokenid"]
        self._user(userid)
        key = f"{userid}!{tokenid}"
        if key in self.user_tokens:
            raise PveError(500, f"Token already exists.")
        token = {"privsep": int(v.get("privsep", 1)), "expire": int(v.get("expire") or 0)}
        if v.get("comment"):
            token["comment"] = v["comment"]
        self.user_tokens[key] = token
        secret = str(uuid.uuid4())
        self.apitokens[key] = secret  # the new token can log in
        return {"full-tokenid": key, "info": dict(token), "value": secret}

    async def _token_read(self, v, user):
        return dict(self._token(v["userid"], v["tokenid"]))

    async def _token_update(self, v, user):
        token = self._token(v["userid"], v["tokenid"])
        if "privsep" in v:
            token["privsep"] = int(v["privsep"])
        if "expire" in v:
            token["expire"] = int(v["expire"] or 0)
        if "comment" in v:
            if v["comment"]:
                token["comment"] = v["comment"]
            else:
                token.pop("comment", None)
        return dict(token)

    async def _token_delete(self, v, user):
        self._token(v["userid"], v["tokenid"])
        key = f"{v['userid']}!{v['tokenid']}"
        del self.user_tokens[key]
        self.apitokens.pop(key, None)
        self.acl_entries = [e for e in self.acl_entries if e["ugid"] != key]
        self._reapply_acl()
        return None

    # --- ACL ---------------------------------------------------------------------------------------

    async def _acl_list(self, v, user):
        return [dict(e) for e in sorted(self.acl_entries, key=lambda e: (e["path"], e["ugid"], e["roleid"]))]

    async def _acl_update(self, v, user):
        path = v["path"].rstrip("/") or "/"
        roles = split_list(v.get("roles"))
        for roleid in roles:
            self.role_privileges(roleid)  # a missing role is PVE's error too
        principals = ([("user", u) for u in split_list(v.get("users"))]
                      + [("token", t) for t in split_list(v.get("tokens"))]
                      + [("group", g) for g in split_list(v.get("groups"))])
        for kind, ugid in principals:
            if kind == "user":
                self._user(ugid)
            elif kind == "token":
                self._token(*ugid.split("!", 1))
            for roleid in roles:
                self.acl_entries = [e for e in self.acl_entries
                                    if (e["path"], e["type"], e["ugid"], e["roleid"]) != (path, kind, ugid, roleid)]
                if not v.get("delete"):
                    self.acl_entries.append({"path": path, "roleid": roleid, "type": kind, "ugid": ugid,
                                             "propagate": int(v.get("propagate", 1))})
        self._reapply_acl()
        return None

    def _reapply_acl(self) -> None:
        """fakepve's privilege table (`acl`, what `allowed` and `/access/permissions` read) from the entries:
        grants made directly (`grant`) stay; those of entries are rebuilt."""
        if self.acl is None:
            self.acl = {}
        for principal, grants in self._acl_granted.items():
            kept = self.acl.get(principal, [])
            for grant in grants:
                if grant in kept:
                    kept.remove(grant)
        granted = {}
        for entry in self.acl_entries:
            privs = self.role_privileges(entry["roleid"]) if (entry["roleid"] in self.roles
                                                              or entry["roleid"] in shapes.ROLES) else set()
            grant = (entry["path"], privs)
            self.acl.setdefault(entry["ugid"], []).append(grant)
            granted.setdefault(entry["ugid"], []).append(grant)
        self._acl_granted = granted
