//! The `device` value a graph names, and the CPU fallback when the GPU it names does not open.

use hearth::gpu::{Device, Opened};

#[test]
fn device_names_parse_and_print_back() {
    for (text, device) in [
        ("cpu", Device::Cpu),
        ("auto", Device::Auto),
        ("cuda", Device::Cuda(0)),
        ("cuda:1", Device::Cuda(1)),
        ("rocm", Device::Rocm(0)),
        ("rocm:2", Device::Rocm(2)),
        ("emulated", Device::Emulated),
    ] {
        assert_eq!(text.parse::<Device>().unwrap(), device, "{text}");
    }
    assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    assert_eq!(Device::Auto.to_string(), "auto");
    let parsed: Device = ron::from_str("\"rocm:1\"").unwrap();
    assert_eq!(parsed, Device::Rocm(1));
}

#[test]
fn bad_device_names_are_errors_that_quote_them() {
    for bad in ["gpu", "cuda:x", "cpu:0", "", "rocm:-1", "CUDA"] {
        let e = bad.parse::<Device>().unwrap_err().to_string();
        assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
    }
    let e = ron::from_str::<Device>("\"vulkan\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("vulkan"), "{e}");
}

#[test]
fn cpu_opens_without_a_notice() {
    assert!(matches!(Device::Cpu.open(), Opened::Cpu(None)));
}

/// Where the named GPU does not open, the device falls back to the CPU with a notice naming the device and
/// the cause; where it does open (a lent GPU), it is that GPU.
#[test]
fn a_missing_gpu_falls_back_to_the_cpu_with_the_reason() {
    for device in [Device::Cuda(0), Device::Rocm(0), Device::Cuda(7)] {
        match device.open() {
            Opened::Gpu(g) => {
                assert_eq!(g.device(), device);
                eprintln!("{device} opened: {}", g.describe());
            }
            Opened::Cpu(Some(notice)) => {
                assert!(
                    notice.starts_with(&format!("device {device}: ")),
                    "{notice}"
                );
                assert!(notice.ends_with("running on the CPU"), "{notice}");
                let built = (matches!(device, Device::Cuda(_)) && cfg!(feature = "cuda"))
                    || (matches!(device, Device::Rocm(_)) && cfg!(feature = "rocm"));
                if !built {
                    assert!(notice.contains("has no `"), "{notice}");
                }
            }
            Opened::Cpu(None) => panic!("{device}: fell back without a notice"),
        }
    }
    match Device::Auto.open() {
        Opened::Gpu(g) => eprintln!("auto opened {}", g.describe()),
        Opened::Cpu(notice) => {
            let notice = notice.expect("auto's fallback says why");
            assert!(
                notice.contains("cuda:0: ") && notice.contains("rocm:0: "),
                "{notice}"
            );
        }
    }
}
