//! Options: parsing, defaults and the errors of `SynthConfig::validate`.

use flowstate_io::synth::{Ipv4Net, Ipv6Net, Profile, SizeDist, SynthConfig, Synthetic};
use flowstate_io::Error;

/// The option an invalid configuration is rejected for, and the message.
fn rejected(cfg: &SynthConfig) -> (&'static str, String) {
    match cfg.validate() {
        Err(Error::Option { name, reason }) => {
            assert!(Synthetic::new(cfg.clone()).is_err());
            (name, reason)
        }
        other => panic!("expected an option error, got {other:?}"),
    }
}

#[test]
fn profiles_parse_and_list_the_valid_names() {
    for p in Profile::ALL {
        assert_eq!(p.name().parse::<Profile>().unwrap(), p);
        assert_eq!(p.to_string(), p.name());
        SynthConfig::new(p).validate().unwrap();
    }
    assert_eq!("LONG".parse::<Profile>().unwrap(), Profile::Long);
    match "bulk".parse::<Profile>() {
        Err(Error::Option { name, reason }) => {
            assert_eq!(name, "profile");
            assert!(reason.contains("\"bulk\""), "{reason}");
            assert!(reason.contains("long, short, mixed, uniform"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn size_distributions_parse() {
    assert_eq!("imix".parse::<SizeDist>().unwrap(), SizeDist::Imix);
    assert_eq!("60".parse::<SizeDist>().unwrap(), SizeDist::Fixed(60));
    assert_eq!(
        "128-1514".parse::<SizeDist>().unwrap(),
        SizeDist::Uniform {
            min: 128,
            max: 1514
        }
    );
    assert_eq!(SizeDist::Uniform { min: 1, max: 2 }.to_string(), "1-2");
    for bad in ["", "big", "59", "1515", "100-90", "64-"] {
        match bad.parse::<SizeDist>() {
            Err(Error::Option { name, .. }) => assert_eq!(name, "packet_size", "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn subnets_parse() {
    let n: Ipv4Net = "10.0.0.0/8".parse().unwrap();
    assert_eq!(n.to_string(), "10.0.0.0/8");
    let n: Ipv6Net = "2001:db8::/32".parse().unwrap();
    assert_eq!(n.prefix_len(), 32);
    assert!("10.0.0.0/33".parse::<Ipv4Net>().is_err());
    assert!("10.0.0.0".parse::<Ipv4Net>().is_err());
    assert!("fd00::/129".parse::<Ipv6Net>().is_err());
}

#[test]
fn defaults_follow_the_papers() {
    let long = SynthConfig::new(Profile::Long);
    assert_eq!(long.packets / long.flows, 10_000);
    let short = SynthConfig::new(Profile::Short);
    assert_eq!(short.packets / short.flows, 100);
    let mixed = SynthConfig::default();
    assert_eq!(mixed.profile, Profile::Mixed);
    assert_eq!(mixed.flows, 17_000);
    let uniform = SynthConfig::new(Profile::Uniform);
    assert_eq!(uniform.packet_size, SizeDist::Fixed(60));
    assert_eq!((uniform.flows, uniform.packets), (50_000, 50_000));
}

#[test]
fn invalid_options_name_the_option() {
    let base = SynthConfig {
        flows: 100,
        packets: 1_000,
        ..SynthConfig::new(Profile::Short)
    };

    let (name, _) = rejected(&SynthConfig {
        flows: 0,
        ..base.clone()
    });
    assert_eq!(name, "flows");

    let (name, reason) = rejected(&SynthConfig {
        packets: 199,
        ..base.clone()
    });
    assert_eq!(name, "packets");
    assert!(reason.contains("at least 200"), "{reason}");
    SynthConfig {
        packets: 200,
        ..base.clone()
    }
    .validate()
    .unwrap();

    let uniform = SynthConfig {
        profile: Profile::Uniform,
        packets: 99,
        ..base.clone()
    };
    let (name, reason) = rejected(&uniform);
    assert_eq!(name, "packets");
    assert!(reason.contains("at least 100"), "{reason}");

    for v in [-0.1, 1.5, f64::NAN] {
        assert_eq!(
            rejected(&SynthConfig {
                ipv6_share: v,
                ..base.clone()
            })
            .0,
            "ipv6_share"
        );
        assert_eq!(
            rejected(&SynthConfig {
                tcp_share: v,
                ..base.clone()
            })
            .0,
            "tcp_share"
        );
    }
    for v in [-1.0, f64::INFINITY, f64::NAN] {
        assert_eq!(
            rejected(&SynthConfig {
                zipf_s: v,
                ..base.clone()
            })
            .0,
            "zipf_s"
        );
    }
    for v in [0.0, -5.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            rejected(&SynthConfig {
                rate_pps: v,
                ..base.clone()
            })
            .0,
            "rate_pps"
        );
    }
    let (name, reason) = rejected(&SynthConfig {
        packet_size: SizeDist::Fixed(1518),
        ..base.clone()
    });
    assert_eq!(name, "packet_size");
    assert!(reason.contains("FCS"), "{reason}");

    let (name, _) = rejected(&SynthConfig {
        servers_v4: "10.20.0.0/16".parse().unwrap(),
        ..base.clone()
    });
    assert_eq!(name, "clients_v4");
    let (name, _) = rejected(&SynthConfig {
        clients_v6: "2001:db8:5::/48".parse().unwrap(),
        ..base.clone()
    });
    assert_eq!(name, "clients_v6");

    // A /32 client subnet is one host: at most 28,232 ephemeral ports, so 28,233 flows fail.
    let one_host = SynthConfig {
        clients_v4: "10.9.9.9/32".parse().unwrap(),
        ipv6_share: 0.0,
        flows: 28_233,
        packets: 60_000,
        ..base.clone()
    };
    assert_eq!(rejected(&one_host).0, "flows");
    SynthConfig {
        flows: 28_232,
        ..one_host
    }
    .validate()
    .unwrap();
}
