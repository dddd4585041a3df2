//! The two layouts a Q8_0 model can keep its weights in: panels (where the CPU has their AVX-512 VNNI kernels)
//! and the GGUF file's own (`HEARTH_Q8_LAYOUT=gguf`, and every other CPU). Both must compute the same model:
//! prefill, decode steps and the tied embedding, on Llama and Qwen3.
//!
//! This binary holds one test only: it sets `HEARTH_Q8_LAYOUT` while it runs, and no other test may read the
//! environment meanwhile.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use hearth::model::transformer::Weight;
use hearth::model::{Arch, LoraTarget, TinySpec, Transformer, write_tiny_model};

/// Logits of a 20-token prefill (the many-row kernels) and then of five decode steps (the one-row kernels),
/// each step fed the first model's greedy token, so both models see the same inputs.
fn prefill_and_decode(models: [&Transformer; 2]) -> Vec<[Vec<f32>; 2]> {
    let mut caches = models.map(Transformer::new_cache);
    let mut input: Vec<u32> = (0..20).map(|i| (i * 37 % 200) as u32 + 1).collect();
    let mut steps = Vec::new();
    for _ in 0..6 {
        let t = Tensor::from_vec(input.clone(), (1, input.len()), &Device::Cpu).unwrap();
        let [a, b] = [0, 1].map(|i| {
            models[i]
                .forward(&t, Some(&mut caches[i]), None)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        });
        let vocab = models[0].config().vocab_size;
        let last = &a[a.len() - vocab..];
        let next = last
            .iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        steps.push([a, b]);
        input = vec![next];
    }
    steps
}

fn is_panels(m: &Transformer) -> bool {
    matches!(
        m.blocks()[0].linear(LoraTarget::Q).weight(),
        Weight::Panels(_)
    )
}

#[test]
fn q8_0_panels_and_the_gguf_layout_compute_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let mut spec = TinySpec::new(arch);
        spec.dtype = GgmlDType::Q8_0;
        let path = dir.path().join(format!("{}.gguf", arch.as_str()));
        write_tiny_model(&path, &spec).unwrap();

        // SAFETY: the only test in this binary; nothing else reads the environment while it runs.
        unsafe { std::env::remove_var("HEARTH_Q8_LAYOUT") };
        let panels = Transformer::from_gguf(&path).unwrap();
        // SAFETY: as above.
        unsafe { std::env::set_var("HEARTH_Q8_LAYOUT", "gguf") };
        let gguf = Transformer::from_gguf(&path).unwrap();
        // SAFETY: as above.
        unsafe { std::env::remove_var("HEARTH_Q8_LAYOUT") };

        // The setting is read: panels where their kernels run, the file's layout when asked for it.
        assert_eq!(is_panels(&panels), hearth::model::q8::panels_usable());
        assert!(!is_panels(&gguf));

        for (step, [a, b]) in prefill_and_decode([&panels, &gguf]).iter().enumerate() {
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
