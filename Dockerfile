# The agent and the simulator in one image (the compose file runs both from it).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
RUN pip install --no-cache-dir . && mkdir -p /var/lib/coordinator
ENTRYPOINT []
CMD ["coordinator", "--help"]
