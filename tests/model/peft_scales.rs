//! LoRA scales and DoRA's forward against literal values PEFT computed once (scripts/peft_scales.py; the
//! constants below are its output as rustfmt lays it out), so that CI catches a formula that drifts from PEFT's
//! (alpha·√r for rsLoRA, a magnitude applied to the wrong side) without PyTorch.

use candle_core::{DType, Device, Tensor, Var};
use hearth::model::{
    Arch, LoraConfig, LoraPair, LoraSet, LoraTarget, QLinear, TinySpec, Transformer,
    write_tiny_model,
};

// peft 0.21.2, torch 2.15.0+cu132
const SCALES: &[(usize, f64, f64, f64)] = &[
    (1, 1.0, 1.0, 1.0),
    (2, 3.0, 1.5, 2.1213203435596424),
    (4, 8.0, 2.0, 4.0),
    (8, 16.0, 2.0, 5.65685424949238),
    (16, 32.0, 2.0, 8.0),
    (3, 5.0, 1.6666666666666667, 2.886751345948129),
    (64, 16.0, 0.25, 2.0),
    (7, 0.5, 0.07142857142857142, 0.1889822365046136),
];
const PATTERN_SCALES: &[(usize, &str, usize, f64)] = &[
    (0, "q_proj", 4, 4.0),
    (0, "k_proj", 4, 4.0),
    (0, "v_proj", 4, 4.0),
    (0, "o_proj", 4, 4.0),
    (0, "gate_proj", 4, 4.0),
    (0, "up_proj", 4, 4.0),
    (0, "down_proj", 8, 2.82842712474619),
    (1, "q_proj", 4, 4.0),
    (1, "k_proj", 4, 4.0),
    (1, "v_proj", 4, 1.0),
    (1, "o_proj", 4, 4.0),
    (1, "gate_proj", 4, 4.0),
    (1, "up_proj", 4, 4.0),
    (1, "down_proj", 8, 2.82842712474619),
];
const DORA_ALPHA: f64 = 3.0;
const DORA_W: [[f64; 4]; 3] = [
    [2.0, -1.0, 0.0, 3.0],
    [1.0, 1.0, -2.0, 0.0],
    [0.0, -3.0, 1.0, 1.0],
];
const DORA_A: [[f64; 4]; 2] = [[1.0, 0.0, -1.0, 2.0], [0.0, 2.0, 1.0, -1.0]];
const DORA_B: [[f64; 2]; 3] = [[1.0, -1.0], [2.0, 0.0], [-1.0, 3.0]];
const DORA_X: [[f64; 4]; 2] = [[1.0, 2.0, -1.0, 0.0], [0.0, -1.0, 3.0, 2.0]];
const DORA_M: [f64; 3] = [3.0, 2.0, 5.0];
const DORA_SCALE: f64 = 1.5;
const DORA_Y: [[f64; 3]; 2] = [
    [-0.46537892099551725, 2.49100947511811, 1.537811713073113],
    [3.1025261399701143, -0.9058216273156763, 0.8787495503274938],
];
const DORA_MERGED: [[f64; 4]; 3] = [
    [
        1.08588414898954,
        -1.241010455988046,
        -0.9307578419910345,
        2.326894604977586,
    ],
    [
        0.9058216273156765,
        0.22645540682891913,
        -1.1322770341445956,
        1.3587324409735149,
    ],
    [
        -0.6590621627456201,
        2.6362486509824805,
        3.0756234261462274,
        -2.855936038564354,
    ],
];
const DORA_RSLORA_SCALE: f64 = 2.1213203435596424;
const DORA_RSLORA_Y: [[f64; 3]; 2] = [
    [-0.5193481428066212, 2.283871414593219, 2.3396104342519486],
    [
        2.7524577222975157,
        -0.46698722404716975,
        -0.14464700007294695,
    ],
];
const DORA_RSLORA_MERGED: [[f64; 4]; 3] = [
    [
        1.0089942675735564,
        -1.2835193479967102,
        -1.0386962856132425,
        2.292513615570267,
    ],
    [
        0.887895244452855,
        0.16936030856250303,
        -1.057255553015358,
        1.437069871780704,
    ],
    [
        -0.6322983740537486,
        2.899585308269224,
        2.82726180823275,
        -2.863423558250987,
    ],
];

/// PEFT's `scaling` and hearth's agree to the last bit or two: both are one f64 division (and a square root).
fn assert_scale(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-12 * want.abs(),
        "{what}: hearth {got}, PEFT {want}"
    );
}

#[test]
fn lora_and_rslora_scales_are_peft_s() {
    for &(r, alpha, plain, rs) in SCALES {
        let mut cfg = LoraConfig::new(r, alpha, &[LoraTarget::Q]);
        assert_scale(
            cfg.scale_for(r, alpha),
            plain,
            &format!("LoRA r {r} alpha {alpha}"),
        );
        cfg.use_rslora = true;
        assert_scale(
            cfg.scale_for(r, alpha),
            rs,
            &format!("rsLoRA r {r} alpha {alpha}"),
        );
    }
}

/// rank_pattern and alpha_pattern reach each module's scale as in PEFT (through `LoraSet::fresh`, which
/// resolves the patterns per module path).
#[test]
fn pattern_scales_are_peft_s() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    write_tiny_model(&p, &TinySpec::new(Arch::Llama)).unwrap();
    let m = Transformer::from_gguf(&p).unwrap();
    let mut cfg = LoraConfig::new(4, 8.0, &LoraTarget::ALL);
    cfg.use_rslora = true;
    cfg.rank_pattern.insert("down_proj".into(), 8);
    cfg.alpha_pattern
        .insert("layers.1.self_attn.v_proj".into(), 2.0);
    let set = LoraSet::fresh(&m, cfg, 1).unwrap();
    assert_eq!(set.len(), PATTERN_SCALES.len());
    for &(layer, target, r, scale) in PATTERN_SCALES {
        let t = LoraTarget::from_peft_name(target).unwrap();
        let pair = set.get(layer, t).unwrap();
        assert_eq!(pair.rank(), r, "layer {layer} {target}");
        assert_scale(pair.scale, scale, &format!("layer {layer} {target}"));
    }
}

fn tensor<const R: usize, const C: usize>(rows: &[[f64; C]; R]) -> Tensor {
    let flat: Vec<f32> = rows.iter().flatten().map(|&v| v as f32).collect();
    Tensor::from_vec(flat, (R, C), &Device::Cpu).unwrap()
}

fn assert_close(got: &Tensor, want: &[Vec<f64>], what: &str) {
    let got = got.to_vec2::<f32>().unwrap();
    let max = want.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (j, (&g, &w)) in g.iter().zip(w).enumerate() {
            // f32 against PEFT's f64, on values of order 1: a few f32 roundings.
            assert!(
                (g as f64 - w).abs() <= 1e-5 * max,
                "{what}[{i}][{j}]: hearth {g}, PEFT {w}"
            );
        }
    }
}

/// DoRA's forward `m ⊙ (W + s·B·A) x / ‖W + s·B·A‖_row` against PEFT's, on every route a pair takes through
/// a layer: a few rows (decode), more rows (prefill), a trained pair (its factor recomputed each call), and
/// the identity as input, which gives PEFT's merged weight (transposed).
#[test]
fn dora_forward_is_peft_s() {
    for (rslora, scale, y, merged) in [
        (false, DORA_SCALE, &DORA_Y, &DORA_MERGED),
        (true, DORA_RSLORA_SCALE, &DORA_RSLORA_Y, &DORA_RSLORA_MERGED),
    ] {
        let what = if rslora { "DoRA with rsLoRA" } else { "DoRA" };
        let mut cfg = LoraConfig::new(DORA_A.len(), DORA_ALPHA, &[LoraTarget::Q]);
        cfg.use_rslora = rslora;
        cfg.use_dora = true;
        let s = cfg.scale_for(DORA_A.len(), DORA_ALPHA);
        assert_scale(s, scale, what);
        let layer = QLinear::from_dense(tensor(&DORA_W)).unwrap();
        let m = Tensor::from_vec(
            DORA_M.iter().map(|&v| v as f32).collect::<Vec<_>>(),
            DORA_M.len(),
            &Device::Cpu,
        )
        .unwrap();
        let (a, b) = (tensor(&DORA_A), tensor(&DORA_B));
        let x = tensor(&DORA_X);
        let want_y: Vec<Vec<f64>> = y.iter().map(|r| r.to_vec()).collect();

        let served = LoraPair::with_magnitude(a.clone(), b.clone(), s, Some(m.clone()));
        let got = layer.forward(&x, Some(&served)).unwrap();
        assert_close(&got, &want_y, &format!("{what}: forward"));
        // Prefill-sized input (past the few-row route): X three times over.
        let x3 = Tensor::cat(&[&x, &x, &x], 0).unwrap();
        let got = layer.forward(&x3, Some(&served)).unwrap();
        let want3: Vec<Vec<f64>> = want_y.iter().cycle().take(6).cloned().collect();
        assert_close(&got, &want3, &format!("{what}: forward, 6 rows"));
        let eye = Tensor::eye(DORA_W[0].len(), DType::F32, &Device::Cpu).unwrap();
        let got = layer
            .forward(&eye, Some(&served))
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap();
        let want_merged: Vec<Vec<f64>> = merged.iter().map(|r| r.to_vec()).collect();
        assert_close(&got, &want_merged, &format!("{what}: merged weight"));

        let (va, vb, vm) = (
            Var::from_tensor(&a).unwrap(),
            Var::from_tensor(&b).unwrap(),
            Var::from_tensor(&m).unwrap(),
        );
        let trained = LoraPair::with_magnitude(
            va.as_tensor().clone(),
            vb.as_tensor().clone(),
            s,
            Some(vm.as_tensor().clone()),
        );
        assert!(trained.tracks());
        let got = layer.forward(&x, Some(&trained)).unwrap();
        assert_close(&got, &want_y, &format!("{what}: forward while training"));
    }
}
