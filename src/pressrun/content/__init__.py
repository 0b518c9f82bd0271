"""Issue bundles: the signed manifest, publisher keys, publishing and verification.

Modules: ``codec`` (pure: manifest JSON, canonical bytes, piece spans, torrent
bencode), ``manifest`` (Ed25519 signatures, hashing files), ``keys`` (key files),
``publish`` (making a bundle), ``bundle`` (loading, listing, verifying bundles),
``cli`` (``pressrun keys new | publish | verify``). See docs/publishing.md.
"""
