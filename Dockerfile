# The agent, the IMDS simulator and the test app server in one image: docker-compose.yml runs all three
# from it (`coordinator run`, `coordinator imds-sim`, `python -m coordinator.testbed.app`).
#
#   docker build -t coordinator .
#   docker run -v /etc/coordinator:/etc/coordinator:ro -v coordinator-state:/var/lib/coordinator \
#       -p 8090:8090 coordinator
#
# The build stage installs the agent's package and the simulator's (sim/, a package of its own: the agent's
# wheel holds only what runs on a VM) into a virtualenv; the final stage copies only that virtualenv
# (no compiler, no pip cache, no pip). The agent runs as an unprivileged user whose only writable path is
# the state volume.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
COPY sim/pyproject.toml sim/README.md ./sim/
COPY sim/azuresim ./sim/azuresim
RUN python -m venv /opt/coordinator \
    && /opt/coordinator/bin/pip install --no-cache-dir --disable-pip-version-check . ./sim \
    && /opt/coordinator/bin/pip uninstall -y --disable-pip-version-check pip setuptools

FROM python:3.11-slim
RUN groupadd --system --gid 10001 coordinator \
    && useradd --system --uid 10001 --gid coordinator --home-dir /var/lib/coordinator --no-create-home \
       --shell /usr/sbin/nologin coordinator \
    && install -d -o coordinator -g coordinator -m 0750 /var/lib/coordinator \
    && install -d -m 0755 /etc/coordinator
COPY --from=build /opt/coordinator /opt/coordinator
COPY deploy/docker/healthcheck.py /usr/local/bin/coordinator-healthcheck
COPY deploy/coordinator.example.yaml /etc/coordinator/coordinator.example.yaml
ENV PATH=/opt/coordinator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The drain state (state_file, default /var/lib/coordinator/state.json) must survive a new container,
# as it survives a reboot of a VM.
VOLUME ["/var/lib/coordinator"]
WORKDIR /var/lib/coordinator
USER 10001:10001
# probe.listen (the load balancer's health probe) and http.listen (/metrics, /status, /livez, /readyz).
EXPOSE 8090 9110
# The admin listener's /livez; the agent must listen there (http.listen 0.0.0.0:9110 or 127.0.0.1:9110).
# Other commands run from this image (the simulator, the app server) set their own check or none.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/usr/local/bin/coordinator-healthcheck", "http://127.0.0.1:9110/livez"]
ENTRYPOINT []
CMD ["coordinator", "run", "--config", "/etc/coordinator/coordinator.yaml"]
