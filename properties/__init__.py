"""normcert's properties: one test file per family, one check function each.

``CHECKS`` maps a property's name to the function that checks one case; the
pytest tests drive them with Hypothesis, ``--replay`` calls them directly.
"""
CHECKS = {
    "accuracy": "normcert.properties.test_accuracy:check_accuracy",
    "extremes": "normcert.properties.test_accuracy:check_accuracy",
    "invariance": "normcert.properties.test_invariance:check_invariance",
    "fusion": "normcert.properties.test_fusion:check_fusion",
    "padding": "normcert.properties.test_masks:check_padding",
    "row-independence": "normcert.properties.test_masks:check_row_independence",
    "gradients": "normcert.properties.test_gradients:check_gradients",
    "contract": "normcert.properties.test_contract:check_contract",
    "determinism": "normcert.properties.test_bitwise:check_determinism",
    "batch-invariance": "normcert.properties.test_bitwise:check_batch_invariance",
}
