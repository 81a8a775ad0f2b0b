"""The export child: turns an exported Chrome trace into a rank's artifacts, in a child
process of the training worker.

``python -m actors.export RAW OUT_DIR`` runs :func:`actors.export.exporter.main`; what the
child and the agent agree on (files, flags, exit codes, the printed result) is in
:mod:`actors.export.contract`. The trace is streamed by :mod:`actors.export.reader`, cut
to the byte cap by :mod:`actors.export.cut`, and tabulated by :mod:`actors.export.tables`.
"""
