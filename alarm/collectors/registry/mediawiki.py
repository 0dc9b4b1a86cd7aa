"""``api: mediawiki``: a wiki's edits, new pages and uploads, from the action API.

Follows MediaWiki's API:RecentChanges page (``action=query&list=recentchanges``, with
``rcprop=title|ids|sizes|flags|user|timestamp|loginfo``, ``rctype=edit|new|log``,
``rcdir=newer`` from ``rcstart``, and the ``continue`` object of API:Continue passed back as
given) in ``formatversion=2``; an upload's size from API:Imageinfo (``prop=imageinfo&iiprop=
size|sha1|timestamp|user|url``) of its ``File:`` page.

Bytes: an edit writes ``|newlen - oldlen|`` bytes and carries up to ``newlen`` (the page as it
now is: a rewrite in place, as on a file system), a new page ``newlen``, an upload the file's
size.  A cursor feed keyed by ``rcid``, which only grows: entries at or below the saved rcid
are repeats, skipped; a newest rcid below the saved one means the wiki was reset or restored
(``cursor_regressions``), and the cursor moves back without counting anything.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from alarm.collectors.registry.http import GarbageResponse, PollError
from alarm.collectors.registry.poller import Cycle, parse_time

RCPROP = "title|ids|sizes|flags|user|timestamp|loginfo"
UPLOAD_ACTIONS = frozenset({"upload", "overwrite", "revert"})


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class MediaWikiAdapter:
    def __init__(self, cfg: Any):
        self.api = cfg.url
        self.index = cfg.url.rsplit("/", 1)[0] + "/index.php" if "/" in cfg.url else cfg.url
        self.namespaces = "|".join(str(n) for n in cfg.namespaces)
        self.page_size = cfg.page_size

    def _url(self, params: dict[str, Any]) -> str:
        query = {"format": "json", "formatversion": "2", **params}
        sep = "&" if "?" in self.api else "?"
        return self.api + sep + urlencode(query)

    async def _query(self, cycle: Cycle, params: dict[str, Any]) -> dict[str, Any]:
        _, doc = await cycle.client.get_json(self._url({"action": "query", **params}))
        if not isinstance(doc, dict):
            raise GarbageResponse("api.php: not an object")
        if isinstance(doc.get("error"), dict):
            err = doc["error"]
            raise PollError(
                f"api.php error {str(err.get('code'))[:64]}: {str(err.get('info'))[:200]}"
            )
        return doc

    def _rc_params(self, **extra: Any) -> dict[str, Any]:
        params = {"list": "recentchanges", "rcprop": RCPROP, "rctype": "edit|new|log", **extra}
        if self.namespaces:
            params["rcnamespace"] = self.namespaces
        return params

    async def _newest(self, cycle: Cycle) -> tuple[int, str | None]:
        doc = await self._query(cycle, self._rc_params(rcdir="older", rclimit=1))
        changes = (doc.get("query") or {}).get("recentchanges") or []
        if not changes:
            return 0, None
        top = changes[0]
        return _int(top.get("rcid")) or 0, str(top.get("timestamp") or "") or None

    async def poll(self, cycle: Cycle) -> None:
        state = cycle.state
        if cycle.learning or "rcid" not in state:
            state["rcid"], state["ts"] = await self._newest(cycle)
            return
        reported = 0
        cont: dict[str, Any] = {}
        trail = cycle.pages("recentchanges")
        while True:
            trail.visit(repr(sorted(cont.items())))
            params = self._rc_params(rcdir="newer", rclimit=self.page_size, **cont)
            if state.get("ts"):
                params["rcstart"] = state["ts"]
            doc = await self._query(cycle, params)
            changes = (doc.get("query") or {}).get("recentchanges")
            if not isinstance(changes, list):
                raise GarbageResponse("recentchanges: not a list")
            cycle.counts["records_read"] += len(changes)
            rcid = state["rcid"]
            for rc in changes:
                if not isinstance(rc, dict) or _int(rc.get("rcid")) is None:
                    cycle.counts["parse_errors"] += 1
                    continue
                if rc["rcid"] <= rcid:
                    continue  # at the cursor: read by the last poll
                if await self._report(cycle, rc):
                    reported += 1
                rcid = rc["rcid"]
                state["rcid"] = rcid
                state["ts"] = str(rc.get("timestamp") or state.get("ts") or "") or None
            await cycle.checkpoint()
            more = doc.get("continue")
            if not isinstance(more, dict) or not changes:
                break
            cont = {str(k): str(v) for k, v in more.items()}
        if not reported:
            newest, ts = await self._newest(cycle)
            if ts is not None and newest < state["rcid"]:
                cycle.counts["cursor_regressions"] += 1
                state["rcid"], state["ts"] = newest, ts

    async def _report(self, cycle: Cycle, rc: dict[str, Any]) -> bool:
        title = str(rc.get("title") or "")
        if not cycle.wanted(title):
            return False
        kind = rc.get("type")
        user = str(rc.get("user")) if rc.get("user") else None
        when = parse_time(rc.get("timestamp"))
        revid, old = _int(rc.get("revid")), _int(rc.get("old_revid"))
        newlen, oldlen = _int(rc.get("newlen")), _int(rc.get("oldlen"))
        if kind in ("edit", "new"):
            size = newlen if kind == "new" else None
            capacity = None
            if kind == "edit" and newlen is not None and oldlen is not None:
                size, capacity = abs(newlen - oldlen), newlen
            delta = (newlen or 0) - (oldlen or 0)
            cycle.found(
                title,
                f"r{revid}",
                size,
                label=f"{title} rev {revid} ({'new page, ' if kind == 'new' else ''}{delta:+d} B)",
                uploaded_at=when,
                uploader=user,
                capacity=capacity,
                receipt={
                    "name": title,
                    "version": str(revid),
                    "kind": "new page" if kind == "new" else "edit",
                    "url": f"{self.index}?diff={revid}" + (f"&oldid={old}" if old else ""),
                    "anonymous": bool(rc.get("anon")) or None,
                },
            )
            return True
        if (
            kind == "log"
            and rc.get("logtype") == "upload"
            and rc.get("logaction") in UPLOAD_ACTIONS
        ):
            size, sha1 = None, None
            if not cycle.learning:
                doc = await self._query(
                    cycle,
                    {
                        "prop": "imageinfo",
                        "titles": title,
                        "iiprop": "size|sha1|timestamp|user|url",
                    },
                )
                pages = (doc.get("query") or {}).get("pages") or []
                info = (
                    (pages[0].get("imageinfo") or [{}])[0]
                    if pages and isinstance(pages[0], dict)
                    else {}
                )
                size, sha1 = _int(info.get("size")), info.get("sha1")
            cycle.found(
                title,
                f"upload {rc.get('timestamp', '')}",
                size,
                label=f"{title} upload ({rc.get('logaction')})",
                uploaded_at=when,
                uploader=user,
                receipt={
                    "name": title,
                    "kind": f"upload ({rc.get('logaction')})",
                    "digest": f"sha1:{sha1}" if sha1 else None,
                    "url": f"{self.index}?title={quote(title)}",
                },
            )
            return True
        return False
