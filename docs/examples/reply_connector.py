#!/usr/bin/env python3
"""A connector that is answered: standard library only, any Python 3, no mcplhost import.

Registers one bidirectional channel, delivers one message that mentions the
agent, then answers every `channels/publish` the way a platform would: it
"posts" the reply (here: one line on stderr, `published: ...`) and answers
`{"delivered": true, "messageId": ...}`. Streamed previews
(`channels/outgoing/chunk`, `/complete`) are notifications: logged, never
answered. Serves until the host closes stdin. See docs/connectors.md §13.
"""
import itertools, json, os, sys, time, uuid  # noqa: E401, I001

CHANNEL = "reply:lobby"
MANIFEST = {"version": "0.5", "channels": {"register": True, "incoming": True, "publish": True}}
QUESTION = os.environ.get("QUESTION", "@helper what is the plan for today?")


def send(message):
    message["jsonrpc"] = "2.0"
    sys.stdout.write(json.dumps(message, separators=(",", ":")) + "\n")  # ASCII, one line
    sys.stdout.flush()


def log(text):
    sys.stderr.write("reply: %s\n" % text)
    sys.stderr.flush()


def plan():
    """What to send once the policy has arrived, one request after each answer."""
    yield "channels/register", {"channels": [{"id": CHANNEL, "label": "#lobby", "direction": "bidirectional"}]}
    yield "channels/incoming", {"messages": [{
        "channelId": CHANNEL, "messageId": str(uuid.uuid4()), "author": {"id": "u1", "name": "Alice"},
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "content": [{"type": "text", "text": QUESTION}],
        "tags": ["chat:mention"]}]}  # a mention: the host adds chat:addressed, so wake_on "addressed" matches


def publish(params):
    """Post the reply to the platform; the answer names the platform's id for the posted message."""
    text = "".join(block.get("text", "") for block in params.get("content") or [] if block.get("type") == "text")
    message_id = "posted-%d" % next(posted)
    log("published: %s to %s in %s as %s" % (json.dumps(text), params.get("channelId"),
                                            params.get("conversationId"), message_id))
    return {"delivered": True, "messageId": message_id}


steps, ids, posted = None, itertools.count(1), itertools.count(1)
for line in iter(sys.stdin.buffer.readline, b""):
    msg = json.loads(line.decode("utf-8")) if line.strip() else {}
    method, params = msg.get("method"), msg.get("params") or {}
    if "result" in msg or "error" in msg:  # the answer to our last request: log it, send the next
        log(json.dumps(msg.get("result", msg.get("error"))))
    elif method is None:
        continue  # a blank line
    elif "id" not in msg:
        if method.startswith("channels/outgoing/"):  # a streamed preview: the final text comes as a publish
            log("%s %s" % (method, json.dumps(params.get("delta", params.get("content")))))
        continue  # notifications (notifications/initialized, …) are never answered
    elif method == "initialize":
        send({"id": msg["id"], "result": {"protocolVersion": params.get("protocolVersion", "2024-11-05"),
              "capabilities": {"experimental": {"mcpl": MANIFEST}}, "serverInfo": {"name": "reply"}}})
        continue
    elif method == "featureSets/update":  # the policy; the grant is params["effectiveCapabilities"]
        send({"id": msg["id"], "result": {"accepted": True}})
        if "channels.publish" not in params.get("effectiveCapabilities", []):
            log("channels.publish not granted: the host will not send replies here")
        if steps is not None:
            continue  # a later update: nothing new to deliver
        steps = plan()
    elif method == "channels/publish":
        send({"id": msg["id"], "result": publish(params)})
        continue
    else:
        send({"id": msg["id"], "result": {}} if method == "ping" else
             {"id": msg["id"], "error": {"code": -32601, "message": "Method not found"}})
        continue
    step = next(steps, None)
    if step is not None:
        send({"id": next(ids), "method": step[0], "params": step[1]})
