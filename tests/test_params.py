"""``param_info``: ‖θ*‖² of the selected parameters, cached only while they are unchanged."""

import torch
from torch import nn

from isouq.params import param_info


def _direct(params):
    return sum(float(p.detach().double().pow(2).sum()) for p in params.values())


def test_sq_norm_follows_every_kind_of_weight_change(monkeypatch):
    torch.manual_seed(0)
    m = nn.Linear(5, 3)
    params = dict(m.named_parameters())
    first = param_info(params).sq_norm
    assert abs(first - _direct(params)) < 1e-5 * first
    with monkeypatch.context() as mp:  # unchanged weights: the cached value, nothing read
        mp.setattr(torch.linalg, "vector_norm", None)
        assert param_info(params).sq_norm == first
    with torch.no_grad():
        m.weight.mul_(2.0)  # in place (an optimizer step)
    assert abs(param_info(params).sq_norm - _direct(params)) < 1e-5 * _direct(params)
    m.weight.data = torch.ones(3, 5)  # a new tensor behind the same parameter
    assert abs(param_info(params).sq_norm - _direct(params)) < 1e-5 * _direct(params)
    m.load_state_dict({"weight": torch.zeros(3, 5), "bias": torch.zeros(3)})
    assert param_info(params).sq_norm == 0.0
