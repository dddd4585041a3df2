//! The two layouts a Q8_0 model can keep its weights in: panels (where the CPU has their AVX-512 VNNI kernels)
//! and the GGUF file's own (`HEARTH_Q8_LAYOUT=gguf`, and every other CPU). Both must compute the same model:
//! prefill and decode steps, on Llama and Qwen3. The file's layout is loaded in a child process, where the
//! variable is set from the start.

use candle_core::quantized::GgmlDType;
use hearth::model::transformer::Weight;
use hearth::model::{Arch, LoraTarget, TinySpec, Transformer, write_tiny_model};

use crate::util::{is_child, prefill_and_decode, rerun_with};

const VAR: &str = "HEARTH_Q8_LAYOUT";
const TEST: &str = "q8_layout::q8_0_panels_and_the_gguf_layout_compute_the_same_model";
const MARK: &str = "q8_layout logits ";

fn is_panels(m: &Transformer) -> bool {
    matches!(
        m.blocks()[0].linear(LoraTarget::Q).weight(),
        Weight::Panels(_)
    )
}

#[test]
fn q8_0_panels_and_the_gguf_layout_compute_the_same_model() {
    let child = is_child(VAR, "gguf");
    let dir = tempfile::tempdir().unwrap();
    let mut ours = Vec::new();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let mut spec = TinySpec::new(arch);
        spec.dtype = GgmlDType::Q8_0;
        let path = dir.path().join(format!("{}.gguf", arch.as_str()));
        write_tiny_model(&path, &spec).unwrap();
        let m = Transformer::from_gguf(&path).unwrap();
        // The setting is read: panels where their kernels run, the file's layout when asked for it.
        if child {
            assert!(!is_panels(&m));
            let logits = serde_json::to_string(&prefill_and_decode(&m)).unwrap();
            println!("{MARK}{logits}");
        } else {
            assert_eq!(is_panels(&m), hearth::model::q8::panels_usable());
            ours.push((arch, prefill_and_decode(&m)));
        }
    }
    if child {
        return;
    }
    let printed = rerun_with(TEST, VAR, "gguf");
    let theirs: Vec<Vec<Vec<f32>>> = printed
        .lines()
        .filter_map(|l| l.split_once(MARK))
        .map(|(_, l)| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(theirs.len(), ours.len(), "logit lines the child printed");
    for ((arch, a), b) in ours.iter().zip(&theirs) {
        assert_eq!(a.len(), b.len());
        for (step, (a, b)) in a.iter().zip(b).enumerate() {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                err <= 1e-4 * scale,
                "{}: step {step}: logits differ by {err} (largest logit {scale})",
                arch.as_str()
            );
        }
    }
}
