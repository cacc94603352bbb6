#!/usr/bin/env python3
"""A minimal MCPL connector: standard library only, any Python 3, no mcplhost import.

Registers one channel, delivers MESSAGES chat messages (default 3) and one push,
then serves until the host closes stdin. Protocol on stdout, logs on stderr.
"""
import itertools, json, os, sys, time, uuid  # noqa: E401, I001

CHANNEL = "minimal:lobby"
MANIFEST = {"version": "0.5", "pushEvents": True, "channels": {"register": True, "incoming": True},
            "featureSets": {"minimal.notes": {"description": "Notes", "uses": ["pushEvents"]}}}


def send(message):
    message["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")  # ASCII, one line
    sys.stdout.flush()


def plan():
    """What to send once the policy has arrived, one request after each answer."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    yield "channels/register", {"channels": [{"id": CHANNEL, "label": "#lobby", "direction": "inbound"}]}
    for n in range(1, int(os.environ.get("MESSAGES", "3")) + 1):
        yield "channels/incoming", {"messages": [{
            "channelId": CHANNEL, "messageId": str(uuid.uuid4()), "author": {"id": "u1", "name": "Alice"},
            "timestamp": now, "content": [{"type": "text", "text": "Hello number %d" % n}]}]}
    yield "push/event", {"featureSet": "minimal.notes", "eventId": str(uuid.uuid4()),  # unique across restarts
                         "timestamp": now, "payload": {"content": [{"type": "text", "text": "Stand-up at ten."}]}}


steps, ids = None, itertools.count(1)
for line in iter(sys.stdin.buffer.readline, b""):
    msg = json.loads(line.decode("utf-8")) if line.strip() else {}
    method, params = msg.get("method"), msg.get("params") or {}
    if "result" in msg or "error" in msg:  # the answer to our last request: log it, send the next
        sys.stderr.write("minimal: %s\n" % json.dumps(msg.get("result", msg.get("error"))))
    elif method is None or "id" not in msg:
        continue  # a blank line, or a notification (notifications/initialized): never answered
    elif method == "initialize":
        send({"id": msg["id"], "result": {"protocolVersion": params.get("protocolVersion", "2024-11-05"),
              "capabilities": {"experimental": {"mcpl": MANIFEST}}, "serverInfo": {"name": "minimal"}}})
        continue
    elif method == "featureSets/update":  # the policy; the grant is params["effectiveCapabilities"]
        send({"id": msg["id"], "result": {"accepted": True}})
        if steps is not None:
            continue  # a later update: nothing new to deliver
        steps = plan()  # the first policy: start delivering
    else:
        send({"id": msg["id"], "result": {}} if method == "ping" else
             {"id": msg["id"], "error": {"code": -32601, "message": "Method not found"}})
        continue
    step = next(steps, None)
    if step is not None:
        send({"id": next(ids), "method": step[0], "params": step[1]})
