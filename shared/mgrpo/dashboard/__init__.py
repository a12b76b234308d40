"""The training dashboard: data assembly for ``/ui`` (``data``, ``trace``), the page itself
(``page``) and an embedded run's folder (``embedded``); the app that serves them is the planner
API's, composed by its caller (``mgrpo ui``: ``mgrpo.cli.ui``). docs/dashboard.md."""
