"""The mobile reader: an installable web app served by ``pressrun serve reader``.

The app itself (plain ES modules, a service worker, a web app manifest) is in
``web/``; its browser dependencies (libsodium.js, pdf.js) are npm packages pinned in
``package-lock.json`` beside this file and installed by ``make setup``. The Python
side only serves those files and the app's ``config.json``; everything else (the
download, the checks, decryption, storage, reading) runs in the browser. See
docs/reader.md.
"""

from pressrun.reader.aio import RunningReader, start_reader
from pressrun.reader.config import ReaderConfig

__all__ = ["ReaderConfig", "RunningReader", "start_reader"]
