"""Host-initiated work on one connection: opening channels, re-fetching the manifest, listing MCP tools.

Handlers never wait on the connector: they queue a job (`McplConnection.schedule`)
and `serve` runs the jobs one at a time, so a policy update a job causes is
serialized with every other one.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from msgspec import Raw

from mcplhost.rpc import ConnectionClosed, RemoteError, RequestTimeout

from . import errors
from .answers import ListedTool, MalformedAnswer, OpenedChannel, ToolsPage, decode_answer, decode_entries
from .channels import Channel, parse_descriptor
from .context import Outbound
from .states import PolicyClosed

OPEN = "open"
MANIFEST = "manifest"
TOOLS = "tools"
#: Bounds on one `tools/list`: pages followed (nextCursor) and tools kept per connector.
MAX_TOOL_PAGES = 16
MAX_TOOLS = 256
#: Entries of one tools/list page judged one by one; the rest are skipped unread (a page within the line limit
#: can hold millions of malformed entries, each costing a decode attempt).
MAX_PAGE_ENTRIES = 4 * MAX_TOOLS


async def serve(conn: Outbound, jobs: Any) -> None:
    """Run queued (job, argument) pairs until the stream closes or the connector is gone."""
    async with jobs:
        async for job, arg in jobs:
            try:
                if job == OPEN:
                    if conn.registry.get(arg.id) != arg:
                        # Removed or replaced while the job waited: nothing of ours to open.
                        conn.log.info("connector.job_skipped", job=job, channel=arg.id, reason="not_registered")
                        continue
                    await open_channel(conn, arg)
                elif job == MANIFEST:
                    await refresh_manifest(conn)
                elif job == TOOLS:
                    await list_tools(conn)
            except (RemoteError, RequestTimeout) as exc:
                conn.log.warning("connector.job_failed", job=job, error=str(exc))
            except errors.ConnectorProtocolError as exc:
                # The grant narrowed while the job waited (e.g. channels.lifecycle revoked).
                conn.log.info("connector.job_skipped", job=job, code=exc.code,
                              data=None if exc.data is msgspec.UNSET else exc.data)
            except ConnectionClosed:
                return  # the connector is gone; its life ends without us
            except PolicyClosed as exc:
                conn.close_by_policy(str(exc))


async def list_tools(conn: Outbound) -> None:
    """tools/list, every page up to the bounds; `conn.tools` becomes the well-formed tools listed.

    A tool is well formed when its `name` is a non-empty string (answers.py
    `ListedTool`); a malformed one is skipped (and counted in the log line),
    never the whole list. A page that is not an object ends the listing, and
    keeps the tools of the pages before it. Pages are judged in a worker
    thread: each malformed entry costs a msgspec error, and a hostile page
    holds millions (tests/bench/bench_answers.py).
    """
    if "tools" not in conn.grant:
        return
    listed: list[ListedTool] = []
    skipped = 0
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        raw = await conn.session.request("tools/list", {"cursor": cursor} if cursor is not None else {},
                                         timeout=conn.spec.request_timeout_s)
        try:
            page, tools, malformed = await anyio.to_thread.run_sync(read_tools_page, raw, abandon_on_cancel=True)
        except MalformedAnswer as exc:
            conn.log.warning("connector.answer_malformed", method=exc.method, detail=exc.detail)
            break
        listed.extend(tools)
        skipped += malformed
        cursor = page.nextCursor
        if cursor is None or len(listed) >= MAX_TOOLS:
            break
    if len(listed) > MAX_TOOLS:
        conn.log.warning("connector.tools_capped", limit=MAX_TOOLS, listed=len(listed))
    conn.tools = listed[:MAX_TOOLS]
    conn.log.info("connector.tools_listed", tools=len(conn.tools), skipped=skipped)


def read_tools_page(raw: Raw) -> tuple[ToolsPage, list[ListedTool], int]:
    """One tools/list page, its well-formed tools and how many were not (pure); MalformedAnswer for a non-object.

    At most MAX_PAGE_ENTRIES entries are judged; the ones after them count as not well formed.
    """
    page = decode_answer(raw, ToolsPage, "tools/list")
    tools, malformed = decode_entries(page.tools[:MAX_PAGE_ENTRIES], ListedTool)
    return page, tools, malformed + max(len(page.tools) - MAX_PAGE_ENTRIES, 0)


async def open_channel(conn: Outbound, channel: Channel, *, timeout: float | None = None,
                       history: int = 0) -> OpenedChannel:
    """channels/open for a channel; the returned descriptor is judged like a registration.

    Returns the decoded result (an agent's `channel_open` reads its backscroll
    from it; a result that is not an object is logged and counts as an empty
    one); `timeout` None: the connector's request_timeout_s. `history` > 0
    asks for that much backscroll, `history: {limit}` as discord-mcpl reads
    it (docs/mcpl-compat.md#backscroll-on-channelsopen); 0 asks for none.
    """
    if "channels.lifecycle" not in conn.grant:
        raise errors.capability_denied("channels.lifecycle")
    params: dict[str, Any] = {"type": channel.type, "address": channel.address, "metadata": channel.metadata or {}}
    if history > 0:
        params["history"] = {"limit": history}
    raw = await conn.session.request(
        "channels/open", params, timeout=conn.spec.request_timeout_s if timeout is None else timeout)
    try:
        result = decode_answer(raw, OpenedChannel, "channels/open")
    except MalformedAnswer as exc:
        conn.log.warning("connector.answer_malformed", method=exc.method, detail=exc.detail, channel=channel.id)
        result = OpenedChannel()
    descriptor = result.channel
    if descriptor is not None:
        if "channels.register" in conn.grant:  # the grant at the answer, not at the registration
            results, _ = conn.registry.add([descriptor])
        else:
            parsed = parse_descriptor(descriptor)
            ident = parsed.id if isinstance(parsed, Channel) else None
            results = [{"id": ident, "accepted": False, "reason": "capability_denied"}]
        if not results[0]["accepted"]:
            conn.log.warning("channels.descriptor_refused", channel=results[0]["id"],
                             reason=results[0].get("reason"), detail="returned by channels/open")
    conn.log.info("channels.opened", channel=channel.id)
    return result


async def refresh_manifest(conn: Outbound) -> None:
    """mcpl/manifest, then apply what changed: removals now, additions pending (SPEC §17)."""
    manifest = conn.manifest
    if not conn.is_ready or manifest is None:
        # Queued before the connection fell back (or never got MCPL): there is
        # nothing to refresh, and a policy sent now could make it ready again.
        conn.log.info("connector.job_skipped", job=MANIFEST, mode=conn.mode.value)
        return
    conn.tracker.fetched()
    try:
        raw = await conn.session.request("mcpl/manifest", {}, timeout=conn.spec.request_timeout_s)
        fetched = msgspec.json.decode(bytes(raw))
    except (RemoteError, RequestTimeout, msgspec.DecodeError) as exc:
        conn.tracker.failed()
        conn.log.warning("connector.manifest_fetch_failed", error=str(exc), failures=conn.tracker.failures)
        return
    change = conn.tracker.diff(manifest, fetched, conn.capabilities, conn.grant, list(conn.spec.grant),
                               conn.feature_sets, conn.spec.feature_sets, offered=conn.offered)
    if change is None:
        conn.log.warning("connector.manifest_unusable", failures=conn.tracker.failures)
        return
    conn.adopt_change(change)
    conn.log.info("connector.manifest_change", impacts=change.impacts)
    if change.grant != conn.grant or change.feature_sets_changed:
        await conn.send_policy(change.grant, initial=False)
