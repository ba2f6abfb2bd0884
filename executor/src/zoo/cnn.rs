//! Convolutional zoo models (ResNet-18/50, VGG-16, MobileNetV2, SqueezeNet 1.1) for 224x224 RGB
//! inputs and 1000 classes. Conv weights are He-initialised and BatchNorm statistics chosen so
//! activations stay O(1) through the depth; residual branches end with a small BN scale so sums
//! do not grow block after block.

use super::builder::{Builder, attr_int, attr_ints};

/// A feature map flowing through the builder: name and C×H×W per sample.
#[derive(Clone)]
pub struct Feat {
    pub name: String,
    pub c: usize,
    pub h: usize,
    pub w: usize,
}

pub struct ConvSpec {
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub groups: usize,
    pub bias: bool,
}

pub fn conv(b: &mut Builder, x: &Feat, s: ConvSpec) -> Feat {
    let cin_g = x.c / s.groups;
    let fan_in = (cin_g * s.k * s.k) as f32;
    let w = b.normal("conv_w", &[s.cout, cin_g, s.k, s.k], (2.0 / fan_in).sqrt());
    let bias = s
        .bias
        .then(|| b.weight("conv_b", &[s.cout], |r| (r.uniform() - 0.5) * 0.1));
    let mut inputs = vec![x.name.as_str(), w.as_str()];
    if let Some(bn) = &bias {
        inputs.push(bn);
    }
    let (k, st, p) = (s.k as i64, s.stride as i64, s.pad as i64);
    let attrs = vec![
        attr_ints("kernel_shape", &[k, k]),
        attr_ints("strides", &[st, st]),
        attr_ints("pads", &[p, p, p, p]),
        attr_int("group", s.groups as i64),
    ];
    let name = b.node("Conv", &inputs, attrs);
    let h = (x.h + 2 * s.pad - s.k) / s.stride + 1;
    let wd = (x.w + 2 * s.pad - s.k) / s.stride + 1;
    b.macs += (s.cout * h * wd * cin_g * s.k * s.k) as u64;
    Feat {
        name,
        c: s.cout,
        h,
        w: wd,
    }
}

/// Inference BatchNorm with statistics near the identity; `gamma` scales the output.
pub fn bn(b: &mut Builder, x: &Feat, gamma: f32) -> Feat {
    let c = x.c;
    let g = b.weight("bn_gamma", &[c], |r| gamma * (0.8 + 0.4 * r.uniform()));
    let be = b.weight("bn_beta", &[c], |r| (r.uniform() - 0.5) * 0.2);
    let m = b.weight("bn_mean", &[c], |r| (r.uniform() - 0.5) * 0.2);
    let v = b.weight("bn_var", &[c], |r| 0.8 + 0.4 * r.uniform());
    let name = b.node("BatchNormalization", &[&x.name, &g, &be, &m, &v], vec![]);
    Feat { name, ..x.clone() }
}

pub fn relu(b: &mut Builder, x: &Feat) -> Feat {
    Feat {
        name: b.node("Relu", &[&x.name], vec![]),
        ..x.clone()
    }
}

pub fn relu6(b: &mut Builder, x: &Feat) -> Feat {
    let lo = b.const_f32("zero", 0.0);
    let hi = b.const_f32("six", 6.0);
    Feat {
        name: b.node("Clip", &[&x.name, &lo, &hi], vec![]),
        ..x.clone()
    }
}

pub fn add(b: &mut Builder, x: &Feat, y: &Feat) -> Feat {
    Feat {
        name: b.node("Add", &[&x.name, &y.name], vec![]),
        ..x.clone()
    }
}

pub fn max_pool(b: &mut Builder, x: &Feat, k: usize, s: usize, p: usize, ceil: bool) -> Feat {
    let (ki, si, pi) = (k as i64, s as i64, p as i64);
    let attrs = vec![
        attr_ints("kernel_shape", &[ki, ki]),
        attr_ints("strides", &[si, si]),
        attr_ints("pads", &[pi, pi, pi, pi]),
        attr_int("ceil_mode", ceil as i64),
    ];
    let out = |n: usize| {
        if ceil {
            (n + 2 * p - k).div_ceil(s) + 1
        } else {
            (n + 2 * p - k) / s + 1
        }
    };
    Feat {
        name: b.node("MaxPool", &[&x.name], attrs),
        c: x.c,
        h: out(x.h),
        w: out(x.w),
    }
}

/// Global average pool, flatten and a fully connected classifier.
pub fn head(b: &mut Builder, x: &Feat, classes: usize) -> String {
    let p = b.node("GlobalAveragePool", &[&x.name], vec![]);
    let f = b.node("Flatten", &[&p], vec![attr_int("axis", 1)]);
    gemm(b, &f, x.c, classes, false)
}

pub fn gemm(b: &mut Builder, x: &str, cin: usize, cout: usize, relu_after: bool) -> String {
    let std = if relu_after {
        (2.0 / cin as f32).sqrt()
    } else {
        (1.0 / cin as f32).sqrt()
    };
    let w = b.normal("fc_w", &[cout, cin], std);
    let bias = b.weight("fc_b", &[cout], |r| (r.uniform() - 0.5) * 0.1);
    b.macs += (cin * cout) as u64;
    b.node("Gemm", &[x, &w, &bias], vec![attr_int("transB", 1)])
}

fn cbr(
    b: &mut Builder,
    x: &Feat,
    cout: usize,
    k: usize,
    stride: usize,
    gamma: f32,
    act: bool,
) -> Feat {
    let c = conv(
        b,
        x,
        ConvSpec {
            cout,
            k,
            stride,
            pad: k / 2,
            groups: 1,
            bias: false,
        },
    );
    let n = bn(b, &c, gamma);
    if act { relu(b, &n) } else { n }
}

pub fn resnet(b: &mut Builder, x: &Feat, depth: usize) -> String {
    let (bottleneck, blocks): (bool, [usize; 4]) = if depth == 50 {
        (true, [3, 4, 6, 3])
    } else {
        (false, [2, 2, 2, 2])
    };
    let mut f = cbr(b, x, 64, 7, 2, 1.0, true);
    f = max_pool(b, &f, 3, 2, 1, false);
    for (stage, &n) in blocks.iter().enumerate() {
        let width = 64 << stage;
        let out_c = if bottleneck { width * 4 } else { width };
        for i in 0..n {
            let stride = if i == 0 && stage > 0 { 2 } else { 1 };
            let branch = if bottleneck {
                let a = cbr(b, &f, width, 1, 1, 1.0, true);
                let a = cbr(b, &a, width, 3, stride, 1.0, true);
                cbr(b, &a, out_c, 1, 1, 0.3, false)
            } else {
                let a = cbr(b, &f, width, 3, stride, 1.0, true);
                cbr(b, &a, out_c, 3, 1, 0.3, false)
            };
            let short = if stride != 1 || f.c != out_c {
                cbr(b, &f, out_c, 1, stride, 0.5, false)
            } else {
                f.clone()
            };
            let s = add(b, &branch, &short);
            f = relu(b, &s);
        }
    }
    head(b, &f, 1000)
}

pub fn vgg16(b: &mut Builder, x: &Feat) -> String {
    let cfg: [&[usize]; 5] = [
        &[64, 64],
        &[128, 128],
        &[256, 256, 256],
        &[512, 512, 512],
        &[512, 512, 512],
    ];
    let mut f = x.clone();
    for stage in cfg {
        for &c in stage {
            f = conv(
                b,
                &f,
                ConvSpec {
                    cout: c,
                    k: 3,
                    stride: 1,
                    pad: 1,
                    groups: 1,
                    bias: true,
                },
            );
            f = relu(b, &f);
        }
        f = max_pool(b, &f, 2, 2, 0, false);
    }
    let flat = b.node("Flatten", &[&f.name], vec![attr_int("axis", 1)]);
    let n = f.c * f.h * f.w;
    let h1 = gemm(b, &flat, n, 4096, true);
    let h1 = b.node("Relu", &[&h1], vec![]);
    let h2 = gemm(b, &h1, 4096, 4096, true);
    let h2 = b.node("Relu", &[&h2], vec![]);
    gemm(b, &h2, 4096, 1000, false)
}

pub fn mobilenet_v2(b: &mut Builder, x: &Feat) -> String {
    let cbr6 = |b: &mut Builder,
                x: &Feat,
                cout: usize,
                k: usize,
                stride: usize,
                groups: usize,
                gamma: f32,
                act: bool| {
        let c = conv(
            b,
            x,
            ConvSpec {
                cout,
                k,
                stride,
                pad: k / 2,
                groups,
                bias: false,
            },
        );
        let n = bn(b, &c, gamma);
        if act { relu6(b, &n) } else { n }
    };
    let mut f = cbr6(b, x, 32, 3, 2, 1, 1.0, true);
    let cfg = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ];
    for (t, c, n, s) in cfg {
        for i in 0..n {
            let stride = if i == 0 { s } else { 1 };
            let hidden = f.c * t;
            let mut y = if t != 1 {
                cbr6(b, &f, hidden, 1, 1, 1, 1.0, true)
            } else {
                f.clone()
            };
            y = cbr6(b, &y, hidden, 3, stride, hidden, 1.0, true);
            let residual = stride == 1 && f.c == c;
            y = cbr6(b, &y, c, 1, 1, 1, if residual { 0.3 } else { 1.0 }, false);
            f = if residual { add(b, &y, &f) } else { y };
        }
    }
    f = cbr6(b, &f, 1280, 1, 1, 1, 1.0, true);
    head(b, &f, 1000)
}

pub fn squeezenet(b: &mut Builder, x: &Feat) -> String {
    let cr = |b: &mut Builder, x: &Feat, cout: usize, k: usize, stride: usize, pad: usize| {
        let c = conv(
            b,
            x,
            ConvSpec {
                cout,
                k,
                stride,
                pad,
                groups: 1,
                bias: true,
            },
        );
        relu(b, &c)
    };
    let fire = |b: &mut Builder, x: &Feat, s: usize, e: usize| {
        let sq = cr(b, x, s, 1, 1, 0);
        let e1 = cr(b, &sq, e, 1, 1, 0);
        let e3 = cr(b, &sq, e, 3, 1, 1);
        let name = b.node("Concat", &[&e1.name, &e3.name], vec![attr_int("axis", 1)]);
        Feat {
            name,
            c: 2 * e,
            ..e1
        }
    };
    let mut f = cr(b, x, 64, 3, 2, 0);
    f = max_pool(b, &f, 3, 2, 0, true);
    f = fire(b, &f, 16, 64);
    f = fire(b, &f, 16, 64);
    f = max_pool(b, &f, 3, 2, 0, true);
    f = fire(b, &f, 32, 128);
    f = fire(b, &f, 32, 128);
    f = max_pool(b, &f, 3, 2, 0, true);
    f = fire(b, &f, 48, 192);
    f = fire(b, &f, 48, 192);
    f = fire(b, &f, 64, 256);
    f = fire(b, &f, 64, 256);
    f = cr(b, &f, 1000, 1, 1, 0);
    let p = b.node("GlobalAveragePool", &[&f.name], vec![]);
    b.node("Flatten", &[&p], vec![attr_int("axis", 1)])
}
