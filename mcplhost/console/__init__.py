"""The web console: what the daemon is doing, live, in a browser (docs/operations.md#console).

Off unless `[console] listen` is set. The pages read the same sources as
`mcplhost status` and the offline readers (the control service's status
object, the store through a read-only connection of the console's own) and
change nothing but through the control service, as `restart-connector`
does, and only when `[console] actions` enables it.

- service.py: the host component (bind, serve with Hypercorn, stop);
- app.py: the Starlette routes and the Jinja2 pages; guard.py: what every
  request passes first (bounds, security headers, the sign-in wall);
- streams.py: the live parts (server-sent events); feed.py: the live feed;
- views.py: each page's reads; charts.py: the overview's SVG charts;
- access.py: the token, sessions and CSRF.
"""

from mcplhost.console.component import Console, ConsoleUnavailable, console_token
from mcplhost.console.feed import FeedFormat, FeedLine

__all__ = ["Console", "ConsoleUnavailable", "FeedFormat", "FeedLine", "console_token"]
