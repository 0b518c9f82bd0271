# pressrun's image, built offline by `pressrun emulate --build-only` (`make images`):
# the base image is a Debian bookworm root file system made with debootstrap and
# imported (no registry pull); the build context holds what the host prepared
# (deps/: every pinned dependency but the host-only plotting ones, unpacked from the
# host's wheels; project/: the pressrun tree and the FLUTE extension make setup built).
# docs/emulation.md.
ARG BASE_IMAGE=pressrun-base:bookworm
FROM ${BASE_IMAGE}
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/opt/pressrun/site LANG=C.UTF-8 PYTHONUNBUFFERED=1
COPY deps/ /opt/pressrun/site/
RUN printf '#!/usr/bin/python3\nimport sys\nfrom pressrun.cli import main\nsys.exit(main())\n' \
        > /usr/local/bin/pressrun \
    && chmod 755 /usr/local/bin/pressrun
COPY project/ /opt/pressrun/site/
RUN python3 -m compileall -q /opt/pressrun/site/pressrun
WORKDIR /var/lib/pressrun
# shapes eth0 from PRESSRUN_LINK_* (pressrun.emulate.link), then runs the command
ENTRYPOINT ["python3", "-m", "pressrun.emulate.entrypoint"]
CMD ["pressrun", "--help"]
