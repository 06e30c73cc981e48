# One image for every Agent Reach service (registry, router, console): compose.yaml picks the command.
FROM python:3.11-slim
WORKDIR /src
COPY . .
# The SDK first: the project depends on it by name and no index serves it.
RUN pip install --no-cache-dir ./sdk . && rm -rf /src
WORKDIR /var/lib/agentreach
ENTRYPOINT ["agentreach"]
