"""Chest radiograph phantoms: anatomy with patient variation, the five disease signs, and the acquisition.

An image is built in two steps. ``render_chest`` draws an attenuation map (0 = air, 1 = dense bone) of
one patient: body outline, lungs with vessels, mediastinum and heart, diaphragm, ribs, clavicles and
spine, each with its own size and position drawn from the patient's random generator, then the disease
signs of ``ChestFindings`` on top of it. ``acquire`` then plays the part of one hospital's X-ray chain
(``ChestProfile``): exposure, gamma, contrast, blur, noise, collimation borders and burned-in markers.

A sign's severity in [0, 1] scales its geometry and density, so a severity near 0 is a sign a
radiologist could miss: that subtlety, the patient variation and the confounders (opacities, nodules,
support devices that no target label explains) are what keep the classification task from saturating.
All work is whole-array numpy on one image at a time: about 15 ms at 256 px, a quarter of that at the
half resolution ``generate`` draws anatomy at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw
from scipy.ndimage import gaussian_filter

from preprocessing.records import CHEST_XRAY_DISEASES


@dataclass(frozen=True)
class ChestFindings:
    """What one image shows: a severity in [0, 1] per canonical disease (0 = absent), and confounders."""

    severity: dict[str, float] = field(default_factory=dict)
    opacity: bool = False  # a non-target opacity (pneumonia, infiltrate) that looks like consolidation
    nodule: bool = False
    devices: bool = False  # tubes, lines, pacemaker
    lateral: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.severity) - set(CHEST_XRAY_DISEASES)
        if unknown:
            raise ValueError(f"unknown diseases {sorted(unknown)}; expected a subset of {CHEST_XRAY_DISEASES}")

    def of(self, disease: str) -> float:
        return float(self.severity.get(disease, 0.0))


@dataclass(frozen=True)
class ChestProfile:
    """One hospital's acquisition chain. Every field is a property of the site, not of the patient."""

    height: int = 256
    width: int = 256
    gamma: float = 1.0  # > 1 darkens the mid-tones
    contrast: float = 1.0
    brightness: float = 0.0
    blur_px: float = 0.6  # detector/scatter blur, in output pixels
    noise: float = 0.02  # quantum noise standard deviation at mid-grey
    border: float = 0.0  # probability of a collimation border
    border_value: float = 0.0  # 0 black or 1 white
    marker: str = ""  # burned-in text, e.g. "R" or "PORTABLE"; empty for none
    heel_effect: float = 0.05  # left-right exposure gradient amplitude


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int) -> np.ndarray:
    """Low-frequency noise in [-1, 1]: a coarse random grid upsampled with cubic splines."""
    coarse = Image.fromarray(rng.uniform(-1.0, 1.0, size=(cells, cells)).astype(np.float32), mode="F")
    return np.asarray(coarse.resize((shape[1], shape[0]), Image.Resampling.BICUBIC))


def _band(distance: np.ndarray, half_width: float, edge: float) -> np.ndarray:
    """A soft band of ``half_width`` around a curve given by its (signed) distance field."""
    return _sigmoid((half_width - np.abs(distance)) / edge)


def render_chest(findings: ChestFindings, rng: np.random.Generator, height: int = 256, width: int = 256) -> np.ndarray:
    """Attenuation map of one patient, float32 (height, width), roughly in [0, 1]."""
    aspect = width / height
    ys = np.linspace(-1.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(-aspect, aspect, width, dtype=np.float32)[None, :]
    # Patient positioning: a small rotation and shift.
    angle, dx, dy = (float(v) for v in rng.normal(0.0, 0.03, size=3))
    x = np.cos(angle) * (xs - dx) - np.sin(angle) * (ys - dy)
    y = np.sin(angle) * (xs - dx) + np.cos(angle) * (ys - dy)
    edge = 2.5 / height  # soft edges of about one pixel
    if findings.lateral:
        density = _lateral_anatomy(findings, rng, x, y, edge)
    else:
        density = _frontal_anatomy(findings, rng, x, y, edge)
    return density.astype(np.float32)


def _frontal_anatomy(findings: ChestFindings, rng: np.random.Generator, x, y, edge) -> np.ndarray:
    body_half_width = rng.uniform(0.78, 0.95)
    habitus = rng.uniform(0.45, 0.62)  # soft-tissue density: thin to heavy patients
    # Torso: widest at the shoulders, tapering to the waist; arms overlap the upper corners.
    taper = body_half_width * (1.0 - 0.10 * np.clip(y, 0, None))
    body = _sigmoid((1.0 - np.abs(x / taper) ** 3 - np.abs((y - 0.25) / 1.35) ** 4) / (8 * edge))
    shoulders = _sigmoid((y + 0.82 + 0.25 * x**2) / (4 * edge))
    soft = habitus * body * np.maximum(shoulders, 0.35)

    # Lungs: superellipses above a domed diaphragm; the patient's right (image left) dome sits higher.
    lung_cx = rng.uniform(0.33, 0.40) * body_half_width / 0.86
    lung_hw = rng.uniform(0.25, 0.30) * body_half_width / 0.86
    lung_top, lung_base = rng.uniform(-0.78, -0.68), rng.uniform(0.40, 0.55)
    atelectasis = findings.of("Atelectasis")
    atelectasis_side = rng.choice((-1.0, 1.0))
    lungs = np.zeros_like(soft)
    lung_of_side = {}
    for side in (-1.0, 1.0):
        base = lung_base - (0.04 if side < 0 else 0.0)
        if atelectasis and side == atelectasis_side:
            base -= 0.12 * atelectasis  # volume loss: the hemidiaphragm rises
        cy, hh = (lung_top + base) / 2, (base - lung_top) / 2 + 0.12
        u = (x - side * lung_cx) / lung_hw
        v = (y - cy) / hh
        shape = 1.0 - np.abs(u) ** 2.4 - np.abs(v) ** 2.4
        dome = base - 0.10 * (1.0 - np.clip(u, -1, 1) ** 2)
        mask = _sigmoid(shape / (6 * edge)) * _sigmoid((dome - y) / (2 * edge))
        lung_of_side[side] = (mask, base, cy, hh)
        lungs = np.maximum(lungs, mask)

    # Vessels: band-passed noise, denser and brighter towards the hila.
    vessels = gaussian_filter(rng.standard_normal(lungs.shape, dtype=np.float32), 1.2)
    vessels -= gaussian_filter(vessels, 4.0)
    vessels /= vessels.std() + 1e-6
    hilar = np.exp(-(((np.abs(x) - 0.22) / 0.35) ** 2 + (y / 0.5) ** 2))

    # Mediastinum and heart displace the air: the heart border is where lung darkness stops.
    # Normal cardiothoracic ratios overlap mild cardiomegaly, as in real films.
    thorax_width = 2 * (lung_cx + lung_hw)
    ctr = rng.normal(0.44, 0.035) + 0.20 * findings.of("Cardiomegaly")
    heart_hw = ctr * thorax_width / 2
    heart_cx, heart_cy = rng.uniform(0.05, 0.12), lung_base - rng.uniform(0.20, 0.26)
    heart_hh = rng.uniform(0.24, 0.29) * (1 + 0.3 * findings.of("Cardiomegaly"))
    heart = _sigmoid((1 - ((x - heart_cx) / heart_hw) ** 2 - ((y - heart_cy) / heart_hh) ** 2) / (6 * edge))
    mediastinum = _sigmoid((0.13 + 0.03 * (y < -0.35) - np.abs(x - 0.02)) / (3 * edge))
    air = lungs * (1.0 - np.maximum(heart, mediastinum))
    # Aeration varies between patients (inspiration depth, emphysema, habitus): a diffuse haze alone is
    # not proof of edema.
    aeration = rng.uniform(0.34, 0.48)
    density = soft - aeration * air + air * (0.03 * np.clip(vessels, 0, None) + 0.10 * hilar)
    density = density + _bones(rng, x, y, edge, lung_cx, lung_hw, lung_top, lung_base) * body
    # Signs live in the aerated lung: the parts of each lung the heart and mediastinum do not cover.
    aerated = {side: mask * (1.0 - np.maximum(heart, mediastinum)) for side, (mask, *_) in lung_of_side.items()}
    density = _frontal_signs(findings, rng, x, y, edge, density, lung_of_side, aerated, lung_cx, lung_hw, atelectasis_side)
    density = _confounders(findings, rng, x, y, edge, density, air, lung_cx)
    return density


def _bones(rng, x, y, edge, lung_cx, lung_hw, lung_top, lung_base) -> np.ndarray:
    bones = np.zeros_like(x)
    # Spine: a column with vertebral bodies every ~0.11, faint behind the mediastinum.
    spine = _band(x, 0.055, 2 * edge) * _sigmoid((y + 1.0) / edge)
    vertebrae = 0.6 + 0.4 * np.cos(2 * np.pi * (y + rng.uniform(0, 1)) / 0.11) ** 2
    bones += 0.12 * spine * vertebrae
    # Posterior ribs: ten arcs per side leaving the spine and curving down laterally, drawn in one pass
    # as a periodic function of the distance to the first arc.
    spacing = (lung_base - lung_top) / 9.0
    duty = rng.uniform(0.28, 0.38)
    lateral = np.abs(x)
    first_arc = lung_top - 0.12 + 0.9 * (lateral - 0.25) ** 2 + 0.10 * lateral
    phase = (y - first_arc) / spacing
    ribs = np.clip(np.cos(np.pi * phase) ** 2 - (1 - duty), 0, None) / duty
    extent = _sigmoid((lung_cx + lung_hw + 0.06 - lateral) / (3 * edge)) * _sigmoid((lateral - 0.04) / edge)
    bones += 0.06 * ribs * extent * (phase > -0.5) * (phase < 9.5) * _sigmoid((lung_base + 0.05 - y) / (3 * edge))
    # Clavicles: slanted bars from the manubrium to the shoulders.
    clavicle_y = lung_top + 0.02 - 0.18 * (lateral - 0.1)
    bones += 0.16 * _band(y - clavicle_y, 0.03, 1.5 * edge) * _sigmoid((0.75 - lateral) / edge) * _sigmoid((lateral - 0.07) / edge)
    return bones


def _frontal_signs(findings, rng, x, y, edge, density, lung_of_side, aerated, lung_cx, lung_hw, atelectasis_side):
    lungs = np.maximum(aerated[-1.0], aerated[1.0])
    effusion = findings.of("Pleural Effusion")
    if effusion:
        sides = (-1.0, 1.0) if rng.random() < 0.4 else (rng.choice((-1.0, 1.0)),)
        for side in sides:
            mask, base = aerated[side], lung_of_side[side][1]
            # The meniscus climbs laterally: even a small effusion blunts the costophrenic angle.
            lateral = np.clip(side * (x - side * lung_cx) / lung_hw, -1, 1)
            level = base - 0.01 - 0.22 * effusion - (0.06 + 0.10 * effusion) * np.clip(lateral, 0, None) ** 2
            fluid = _sigmoid((y - level) / (5 * edge)) * mask
            density = density + (0.10 + 0.12 * effusion) * fluid
    consolidation = findings.of("Consolidation")
    if consolidation:
        for _ in range(1 + int(rng.random() < 0.3)):
            density = density + _blob(rng, x, y, lungs, lung_cx, 0.06 + 0.10 * consolidation,
                                      0.10 + 0.20 * consolidation, lobe_y=(-0.1, 0.35))
    atelectasis = findings.of("Atelectasis")
    if atelectasis:
        mask, base = aerated[atelectasis_side], lung_of_side[atelectasis_side][1]
        # Plate-like (discoid) atelectasis: a thin oblique line above the dome; severe cases add a wedge.
        cx = atelectasis_side * lung_cx + rng.normal(0, 0.04)
        cy = base - rng.uniform(0.12, 0.28)
        tilt = rng.normal(0, 0.25)
        distance = (y - cy) * np.cos(tilt) - (x - cx) * np.sin(tilt)
        along = np.abs((x - cx) * np.cos(tilt) + (y - cy) * np.sin(tilt))
        line = _band(distance, 0.012 + 0.025 * atelectasis, 2 * edge) * _sigmoid((0.12 + 0.08 * atelectasis - along) / (3 * edge))
        density = density + (0.12 + 0.22 * atelectasis) * line * mask
        if atelectasis > 0.55:
            wedge = _sigmoid((y - (base - 0.25) - 0.4 * np.abs(x - atelectasis_side * (lung_cx + 0.5 * lung_hw))) / (4 * edge))
            density = density + 0.15 * atelectasis * wedge * mask
    edema = findings.of("Edema")
    if edema:
        # Bat-wing perihilar haze, bilateral, fading to the periphery, plus Kerley B lines when marked.
        haze = np.exp(-(((np.abs(x) - 0.18) / (0.28 + 0.12 * edema)) ** 2 + ((y - 0.0) / 0.45) ** 2))
        texture = 0.75 + 0.25 * _smooth_noise(rng, x.shape, 12)
        density = density + (0.015 + 0.07 * edema) * haze * texture * lungs
        if edema > 0.7:
            for side in (-1.0, 1.0):
                for k in range(4):
                    ky = lung_of_side[side][1] - 0.08 - 0.045 * k
                    kx = side * (lung_cx + lung_hw * 0.8)
                    line = _band(y - ky, 0.006, edge) * _sigmoid((0.06 - np.abs(x - kx)) / edge)
                    density = density + 0.06 * edema * line * lungs
    return density


def _blob(rng, x, y, region, lung_cx, radius, amplitude, lobe_y) -> np.ndarray:
    """A dense focal opacity with an irregular edge, placed inside ``region`` (a lung mask)."""
    side = rng.choice((-1.0, 1.0))
    cx = side * lung_cx + rng.normal(0, 0.06)
    cy = rng.uniform(*lobe_y)
    r = np.sqrt((x - cx) ** 2 + ((y - cy) / 1.2) ** 2) / radius
    irregular = r * (1 + 0.25 * _smooth_noise(rng, x.shape, 10))
    return amplitude * _sigmoid((1 - irregular) / 0.25) * region


def _confounders(findings, rng, x, y, edge, density, lungs, lung_cx):
    if findings.opacity:
        density = density + _blob(rng, x, y, lungs, lung_cx, rng.uniform(0.05, 0.15), rng.uniform(0.06, 0.18), (-0.5, 0.3))
    if findings.nodule:
        density = density + _blob(rng, x, y, lungs, lung_cx, rng.uniform(0.02, 0.05), rng.uniform(0.15, 0.3), (-0.6, 0.3))
    if findings.devices:
        # An endotracheal / central line: a thin bright tube down the mediastinum, curving into one side.
        side = rng.choice((-1.0, 1.0))
        path_x = 0.02 + side * 0.25 * np.clip((y + 0.2) / 0.6, 0, 1) ** 2
        tube = _band(x - path_x, 0.008, edge) * _sigmoid((y + 1.0) / edge) * _sigmoid((0.3 - y) / edge)
        density = density + 0.35 * tube
        if rng.random() < 0.3:  # pacemaker can
            can = _sigmoid((1 - ((x + 0.45 * side) / 0.07) ** 2 - ((y + 0.6) / 0.05) ** 2) / 0.2)
            density = density + 0.6 * can
    return density


def _lateral_anatomy(findings: ChestFindings, rng: np.random.Generator, x, y, edge) -> np.ndarray:
    """A lateral projection: anterior to the image left, spine posterior, both lungs superimposed."""
    depth = rng.uniform(0.70, 0.88)
    habitus = rng.uniform(0.50, 0.66)
    body = _sigmoid((1.0 - (x / depth) ** 4 - ((y - 0.2) / 1.3) ** 4) / (8 * edge))
    density = habitus * body
    lung_base = rng.uniform(0.40, 0.55)
    lung = _sigmoid((1 - ((x - 0.05) / (depth * 0.78)) ** 2 - ((y + 0.1) / 0.72) ** 2) / (6 * edge))
    lung *= _sigmoid((lung_base - 0.15 * (x - 0.05) - y) / (2 * edge))
    density = density - 0.32 * lung
    heart_r = rng.uniform(0.26, 0.32) * (1 + 0.35 * findings.of("Cardiomegaly"))
    heart = _sigmoid((1 - ((x + 0.30) / heart_r) ** 2 - ((y - lung_base + 0.25) / (heart_r * 1.1)) ** 2) / (6 * edge))
    density = density + 0.22 * heart * lung
    spine_x = depth * 0.72
    vertebrae = 0.6 + 0.4 * np.cos(2 * np.pi * (y + rng.uniform(0, 1)) / 0.12) ** 2
    density = density + 0.25 * _band(x - spine_x, 0.09, 2 * edge) * vertebrae * body
    if findings.of("Pleural Effusion"):
        level = lung_base - 0.05 - 0.3 * findings.of("Pleural Effusion") - 0.15 * np.clip(x - 0.2, 0, None)
        density = density + 0.25 * _sigmoid((y - level) / (5 * edge)) * lung
    for disease, radius, amplitude in (("Consolidation", 0.14, 0.22), ("Atelectasis", 0.07, 0.2)):
        if findings.of(disease):
            density = density + _blob(rng, x, y, lung, 0.0, radius * (0.6 + findings.of(disease)),
                                      amplitude * (0.5 + findings.of(disease)), (-0.1, 0.3))
    if findings.of("Edema"):
        density = density + (0.07 + 0.15 * findings.of("Edema")) * np.exp(-((x / 0.4) ** 2 + (y / 0.4) ** 2)) * lung
    return _confounders(findings, rng, x, y, edge, density, lung, 0.0)


def upsample(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a float image (Pillow's "F" mode keeps float32 precision)."""
    if image.shape == (height, width):
        return image
    resized = Image.fromarray(image.astype(np.float32), mode="F").resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(resized)


def acquire(density: np.ndarray, profile: ChestProfile, rng: np.random.Generator) -> np.ndarray:
    """Pass an attenuation map through one hospital's X-ray chain: float32 in [0, 1], bright = dense."""
    height, width = density.shape
    exposure = 1.0 + profile.heel_effect * np.linspace(-1, 1, width, dtype=np.float32)[None, :]
    image = np.clip(density * exposure, 0.0, 1.2) / 1.2
    image = np.power(image + 0.04, profile.gamma)
    image = (image - 0.5) * profile.contrast + 0.5 + profile.brightness + rng.normal(0, 0.03)
    if profile.blur_px > 0:
        image = gaussian_filter(image, profile.blur_px)
    image = image + profile.noise * np.sqrt(np.clip(image, 0.05, 1.0)) * rng.standard_normal(image.shape)
    image = np.clip(image, 0.0, 1.0)
    if profile.border and rng.random() < profile.border:
        top, bottom, left, right = (rng.integers(0, max(2, s // 12)) for s in (height, height, width, width))
        image[:top], image[height - bottom:], image[:, :left], image[:, width - right:] = (profile.border_value,) * 4
    if profile.marker:
        image = _burn_in(image, profile.marker, rng)
    return image.astype(np.float32)


def detector_film(findings: ChestFindings, profile: ChestProfile, rng: np.random.Generator) -> np.ndarray:
    """A film at full detector resolution (CheXpert and MIMIC-CXR exports are about 3000x2500): anatomy
    drawn at 1/8 of ``profile``'s size (it is smooth, and drawing it at 3000 px would take seconds), then
    blur, quantum noise and markers per detector pixel, which is what sets the size of a JPEG export."""
    density = render_chest(findings, rng, max(96, profile.height // 8), max(96, profile.width // 8))
    return acquire(upsample(density, profile.height, profile.width), profile, rng)


def _burn_in(image: np.ndarray, text: str, rng: np.random.Generator) -> np.ndarray:
    """Burned-in annotation as on real films: white text in a corner, drawn with Pillow's bitmap font."""
    height, width = image.shape
    layer = Image.new("L", (width, height), 0)
    corner_x = int(rng.uniform(0.04, 0.10) * width) if rng.random() < 0.5 else int(width * 0.80)
    ImageDraw.Draw(layer).text((corner_x, int(0.04 * height)), text, fill=255)
    mask = np.asarray(layer, dtype=np.float32) / 255.0
    return np.maximum(image, mask)
