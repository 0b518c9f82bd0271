# pressrun's image, built offline by `pressrun emulate --build-only` (`make images`)
# over pressrun-deps:KEY (pressrun.emulate.images: the Debian bookworm root file
# system made with mmdebstrap and imported, plus every pinned dependency but the
# host-only plotting ones, unpacked from the host's wheels, and the `pressrun`
# command; built once per dependency set). The context holds only project/: the
# pressrun tree, byte-compiled on the host (the image's Python is 3.11 too), the
# FLUTE extension make setup built, and the web reader's npm packages (the tree's
# node_modules, or installed into the context by npm ci from the reader's
# package-lock.json, on the host from npm's cache: the image has no Node.js, and the
# build runs with no network). No RUN step: a changed tree is one COPY layer.
# docs/emulation.md.
ARG DEPS_IMAGE=pressrun-deps:latest
FROM ${DEPS_IMAGE}
COPY project/ /opt/pressrun/site/
# shapes eth0 from PRESSRUN_LINK_* (pressrun.emulate.link), then runs the command
ENTRYPOINT ["python3", "-m", "pressrun.emulate.entrypoint"]
CMD ["pressrun", "--help"]
