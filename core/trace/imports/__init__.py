"""Other tools' files, recognised by content: benchmark clients (vLLM bench serve, SGLang,
AIPerf, guidellm, inference-perf) and vLLM's own telemetry (iteration log, OpenTelemetry spans,
KV-cache events). sniff.py decides which importer reads a file; every importer returns an
Imported (imported.py) whose trace labels every value by where and how it was measured."""
