"""Plugins that put isouq's scores inside other tools (application layer).

- :mod:`isouq.integrations.polygraph`: LM-Polygraph (``pip install 'isouq[polygraph]'``): a stat
  calculator and estimators for ``polygraph_eval`` configs and ``estimate_uncertainty``.

Each plugin imports with isouq's own dependencies alone; using one without the other tool
installed raises :class:`isouq.errors.MissingExtraError` naming the extra that installs it.
"""
