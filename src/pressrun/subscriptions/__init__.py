"""The subscription service: subscribers' X25519 keys and each issue version's wraps.

Modules: ``codec`` (pure: tokens, request bodies, errors), ``store`` (SQLite),
``aio`` (the aiohttp service, ``pressrun serve subscriptions``), ``client`` (what the
publisher, ``pressrun subscribers`` and ``pressrun get`` call), ``cli``. The HTTP API
is docs/protocols.md, "Subscription service HTTP"; operating it is
docs/subscriptions.md.
"""
