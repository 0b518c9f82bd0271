# pressrun's image, built offline by `pressrun emulate --build-only` (`make images`):
# the base image is a Debian bookworm root file system made with debootstrap and
# imported (no registry pull); the build context holds the wheels the host built
# (deps/: every pinned dependency, project/: pressrun). docs/emulation.md.
ARG BASE_IMAGE=pressrun-base:bookworm
FROM ${BASE_IMAGE}
ENV PATH=/opt/pressrun/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY deps/ /tmp/wheels/deps/
RUN python3 -m venv /opt/pressrun \
    && /opt/pressrun/bin/pip install -q --no-index --no-cache-dir /tmp/wheels/deps/*.whl \
    && rm -rf /tmp/wheels
COPY project/ /tmp/wheels/project/
RUN /opt/pressrun/bin/pip install -q --no-index --no-deps --no-cache-dir /tmp/wheels/project/*.whl \
    && rm -rf /tmp/wheels
WORKDIR /var/lib/pressrun
# shapes eth0 from PRESSRUN_LINK_* (pressrun.emulate.link), then runs the command
ENTRYPOINT ["/opt/pressrun/bin/python", "-m", "pressrun.emulate.entrypoint"]
CMD ["pressrun", "--help"]
