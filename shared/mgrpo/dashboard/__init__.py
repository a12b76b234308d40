"""The training dashboard: data assembly for ``/ui`` (``data``, ``trace``), the page itself
(``page``) and the embedded-run server of ``mgrpo ui`` (``embedded``). docs/dashboard.md."""
