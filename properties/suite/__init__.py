"""The suite a certify run collects, by this folder's path: one test module per property family
(or pair), each naming its family with the ``normcert_family`` mark, and the replay test.

Nothing imports these modules; they import ``properties.run.outcomes`` and the layers below.
normcert's tests of itself are in ``properties.tests``, which a certify run never collects.
"""
