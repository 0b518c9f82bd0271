"""pressrun's BitTorrent HTTP tracker (BEP 3, 23, 48) with fairness accounting.

``core`` decides (pure, driven with ``now``), ``codec`` turns bytes into messages and
back, ``store`` keeps records in SQLite or Redis, ``aio`` is the aiohttp adapter and
``cli`` registers ``pressrun serve tracker``.
"""
