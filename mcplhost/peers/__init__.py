"""Messages between the agents of one tree (docs/peers.md).

Relationships come from the agents' `parent` chains only (tree.py); a
message to a descendant is trusted guidance, any other is wrapped in the
untrusted envelope (envelope.py); admission checks the guards and throttles
in docs/peers.md's order (admission.py, constants in limits.py); admitted
messages wait in a durable, sealed queue in SQLite until delivered exactly
once (service.py, mcplhost/store/peers.py).
"""
