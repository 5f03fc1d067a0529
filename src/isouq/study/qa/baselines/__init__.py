"""The QA study's sampling-based baselines (naive entropy, semantic entropy, P(True)): one
module each. Their names, settings rule and the way they run on a batch of answers are in the
method registry (``isouq.methods``, ``isouq.study.qa.methods``)."""
