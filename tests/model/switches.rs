//! The environment switches that let a benchmark compare two paths in one build, each shown to change
//! behaviour in a child process that has it set from the start.

use candle_core::quantized::GgmlDType;
use hearth::model::transformer::Weight;
use hearth::model::{Arch, LoraTarget, TinySpec, Transformer, write_tiny_model};

use crate::util::{is_child, rerun_with};

/// Weights a decode step streams are offered to the kernel for huge pages at load, unless
/// `HEARTH_HUGE_PAGES=off`: then no attempt at all.
#[test]
fn huge_pages_are_asked_for_unless_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TinySpec::new(Arch::Llama);
    // Matrices of over 2 MiB, so that each covers at least one whole huge-page-aligned chunk.
    spec.hidden_size = 512;
    spec.intermediate_size = 4096;
    spec.dtype = GgmlDType::Q8_0;
    let path = dir.path().join("model.gguf");
    write_tiny_model(&path, &spec).unwrap();
    let report = Transformer::from_gguf(&path).unwrap().huge_pages();
    let attempts = report.collapsed_chunks + report.refused_chunks;
    if is_child("HEARTH_HUGE_PAGES", "off") {
        assert_eq!(attempts, 0, "{report:?}");
        return;
    }
    assert!(attempts > 0, "{report:?}");
    rerun_with(
        "switches::huge_pages_are_asked_for_unless_switched_off",
        "HEARTH_HUGE_PAGES",
        "off",
    );
}

/// `HEARTH_Q8_KERNEL=avx2` forces the AVX2 int8 kernels over AVX-VNNI and AVX-512 VNNI, and with them the GGUF
/// layout for Q8_0 weights (the panels need AVX-512 VNNI). On a CPU with neither VNNI both processes agree.
#[test]
fn q8_kernel_avx2_forces_the_avx2_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = TinySpec::new(Arch::Llama);
    spec.dtype = GgmlDType::Q8_0;
    let path = dir.path().join("model.gguf");
    write_tiny_model(&path, &spec).unwrap();
    let m = Transformer::from_gguf(&path).unwrap();
    let panels = matches!(
        m.blocks()[0].linear(LoraTarget::Q).weight(),
        Weight::Panels(_)
    );
    let kernel = hearth::model::q8::int8_kernel();
    if is_child("HEARTH_Q8_KERNEL", "avx2") {
        assert!(matches!(kernel, "avx2" | "portable"), "{kernel}");
        assert!(!hearth::model::q8::panels_usable() && !panels);
        return;
    }
    assert_eq!(panels, hearth::model::q8::panels_usable());
    rerun_with(
        "switches::q8_kernel_avx2_forces_the_avx2_kernels",
        "HEARTH_Q8_KERNEL",
        "avx2",
    );
}
