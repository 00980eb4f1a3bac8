"""The small public API in klbook_lib/__init__.py resolves to the documented functions."""
import numpy as np
import pytest

import klbook_lib as kb


def test_top_level_names_are_the_module_functions():
    assert kb.kl is kb.divergences.kl
    assert kb.k3 is kb.estimators.k3
    assert kb.dpo_loss is kb.dpo.dpo_loss
    assert kb.optimal_policy is kb.optimal.optimal_policy
    assert float(kb.kl(np.array([0.5, 0.5]), np.array([0.5, 0.5]))) == 0.0


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kb.nope
