"""The control socket: `mcplhost status` and `restart-connector` ask the running daemon (docs/operations.md#status-and-the-control-socket).

- wire.py: the protocol, one JSON line each way, bounded;
- status.py: pure: the status object from the components' snapshots, its table, the `--check` verdict, STATUS= text;
- responder.py: what the daemon answers, read from its components (no second bookkeeping);
- server.py: the Unix listener (mode 0600, never TCP), one bounded task per client;
- client.py: what the command uses.
"""
