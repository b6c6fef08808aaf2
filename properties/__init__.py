"""normcert's properties: one test file per family, one check function each.

``CHECKS`` maps a property's name to the function that checks one case; the
pytest tests drive them with Hypothesis, ``--replay`` calls them directly.
"""
CHECKS = {
    "accuracy": "properties.test_accuracy:check_accuracy",
    "extremes": "properties.test_accuracy:check_accuracy",
    "invariance": "properties.test_invariance:check_invariance",
    "fusion": "properties.test_fusion:check_fusion",
    "padding": "properties.test_masks:check_padding",
    "row-independence": "properties.test_masks:check_row_independence",
    "gradients": "properties.test_gradients:check_gradients",
    "contract": "properties.test_contract:check_contract",
    "determinism": "properties.test_bitwise:check_determinism",
    "batch-invariance": "properties.test_bitwise:check_batch_invariance",
}
