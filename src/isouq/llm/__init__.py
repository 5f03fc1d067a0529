"""Answers from causal language models: prompts (chat templates, the QA prompt), greedy and
sampled generation, and the packed logits that read token probabilities of many answers."""
