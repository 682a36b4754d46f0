"""The shader preprocessor (cera.kernels.preprocess): includes, conditionals, and includes
written once for several names (parameters), on small sources of its own."""
import pytest

from cera import kernels

SOURCES = {
    "main_test.wgsl": '#include "twice_test.wgsl" A=k T=K\n#include "twice_test.wgsl" A=v T=V\n'
                      '#include "twice_test.wgsl" A=k T=K\nfn main() {}\n',
    "twice_test.wgsl": '#include "once_test.wgsl"\n#ifdef ${T}_F16\nfn ${A}_load() -> f16 { return ${A}[0]; }\n'
                       '#else\nfn ${A}_load() -> f32 { return ${A}[0]; }\n#endif\n',
    "once_test.wgsl": "const ONCE = 1u;\n",
    "unset_test.wgsl": '#include "twice_test.wgsl" A=k\n',
}


@pytest.fixture(autouse=True)
def sources():
    kernels.override(SOURCES)


def test_a_parameterized_include_is_expanded_once_per_set_of_parameters():
    lines = kernels.preprocess("main_test.wgsl", {"V_F16": True}).splitlines()
    assert lines == ["const ONCE = 1u;", "fn k_load() -> f32 { return k[0]; }", "fn v_load() -> f16 { return v[0]; }",
                     "fn main() {}"]


def test_a_parameter_left_unset_is_an_error():
    with pytest.raises(ValueError, match=r"twice_test.wgsl: a parameter left unset: \$\{T\}"):
        kernels.preprocess("unset_test.wgsl", {})
