"""The paper's study apparatus, apart from the library users import.

- ``reference``: reference posteriors (HMC, VI, analytic) the gradient scores are checked against;
- ``experiments``: the paper's experiments (``isouq experiment``);
- ``qa``: the QA study's pipelines (``isouq qa``) and its baselines;
- ``analysis``: the study's tables (AUROC, significance, transfer, cost) over its rows;
- ``report``: ``isouq report``, the HTML/Markdown report and the docs' generated tables.

Nothing in the library (``isouq.scores``, ``isouq.sequences``, ``isouq.ghost``, …) imports
from here; the application (CLI, ``ask``, ``serve``) does.
"""
