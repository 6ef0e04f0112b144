"""``delayq web``: a small page (and JSON API) to see and manage what is scheduled.

Starlette + uvicorn + Jinja2, assets shipped in the package (works offline), every read
bounded through :mod:`delayq_transport.browse`. Needs the ``web`` extra: ``pip install
'delayq[web]'``. Security options are described in :mod:`.security` and docs/how-to/manage-tasks.md.
"""

from __future__ import annotations
