"""What every test shares: a fresh Pulumi runtime.

Tests that run the program or a component under `pulumi.runtime.set_mocks` leave the SDK's ambient
settings behind (its monitor, feature set, package references, callbacks: context variables
that `set_mocks` does not all reset). A language host starts each program from the defaults, so every
test ends by putting them back.
"""

import pulumi.runtime.settings as runtime_settings
import pytest


@pytest.fixture(autouse=True)
def _fresh_pulumi_runtime():
    yield
    runtime_settings.configure(runtime_settings.Settings(project="project", stack="stack"))
