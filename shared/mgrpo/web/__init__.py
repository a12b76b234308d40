"""HTTP plumbing every FastAPI app of mgrpo shares (the planner API, the sandbox service, the
dashboard): a request body limit (``body_limit``), Swagger UI and ReDoc served from local
files (``docs_assets``), one error shape and uvicorn's options (``server``).

What this package does NOT do: define routes or know a service; it imports no other room of
mgrpo."""
