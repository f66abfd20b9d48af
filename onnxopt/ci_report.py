"""Reports for CI systems: JUnit XML for dashboards and a short markdown summary for pull requests."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

from onnxopt.checks import CheckResult
from onnxopt.report import OptimizeReport


@dataclass(frozen=True)
class ModelOutcome:
    """What happened to one model in a CI run: a report, threshold results, or an error."""

    model: str
    report: OptimizeReport | None = None
    checks: tuple[CheckResult, ...] = ()
    error: str | None = None
    output: str | None = None
    seconds: float = 0.0
    failures: tuple[str, ...] = field(default=())

    @property
    def status(self) -> str:
        if self.error is not None:
            return "error"
        return "failed" if self.failures else "ok"


def outcome_failures(
    report: OptimizeReport | None, checks: Sequence[CheckResult]
) -> tuple[str, ...]:
    lines: list[str] = []
    if report is not None and report.validation is not None and not report.validation.passed:
        names = ", ".join(report.validation.failing_outputs()) or "; ".join(
            report.validation.errors
        )
        lines.append(f"validation failed: {names}")
    lines.extend(c.message for c in checks if not c.passed)
    return tuple(lines)


# Characters XML 1.0 cannot hold even escaped (control characters, surrogates, U+FFFE/FFFF).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _escape_char(match: re.Match[str]) -> str:
    return (
        f"\\x{ord(match.group()):02x}"
        if ord(match.group()) < 256
        else f"\\u{ord(match.group()):04x}"
    )


def _xml_safe(text: str) -> str:
    """``text`` with what XML cannot carry written as a ``\\xNN`` escape (model and value names are arbitrary)."""
    return _NOT_XML.sub(_escape_char, text)


def _markdown_cell(text: str) -> str:
    """``text`` for a table cell's code span: one line, no column break, no closing backtick."""
    return _CONTROL.sub(_escape_char, text).replace("|", "\\|").replace("`", "'")


def junit_xml(outcomes: Sequence[ModelOutcome]) -> bytes:
    """One testsuite; per model a 'validation' case and one case per threshold."""
    suite = ET.Element("testsuite", name="onnxopt")
    tests = failures = errors = 0
    total_time = 0.0
    for outcome in outcomes:
        total_time += outcome.seconds
        if outcome.error is not None:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=outcome.model,
                name="optimize",
                time=f"{outcome.seconds:.3f}",
            )
            ET.SubElement(case, "error", message=outcome.error).text = outcome.error
            tests += 1
            errors += 1
            continue
        report = outcome.report
        assert report is not None
        case = ET.SubElement(
            suite,
            "testcase",
            classname=outcome.model,
            name="validation",
            time=f"{outcome.seconds:.3f}",
        )
        tests += 1
        if report.validation is None:
            ET.SubElement(case, "skipped", message="--no-validate")
        elif not report.validation.passed:
            message = outcome_failures(report, ())[0]
            ET.SubElement(case, "failure", message=message).text = message
            failures += 1
        for check in outcome.checks:
            case = ET.SubElement(
                suite, "testcase", classname=outcome.model, name=check.name, time="0"
            )
            tests += 1
            if not check.passed:
                ET.SubElement(case, "failure", message=check.message).text = check.message
                failures += 1
            else:
                ET.SubElement(case, "system-out").text = check.message
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("time", f"{total_time:.3f}")
    for element in suite.iter():
        if element.text:
            element.text = _xml_safe(element.text)
        for key, value in element.attrib.items():
            element.set(key, _xml_safe(value))
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def markdown_summary(outcomes: Sequence[ModelOutcome]) -> str:
    """A compact table for a pull-request comment, then one line per failure."""
    failed = sum(o.status != "ok" for o in outcomes)
    head = (
        "✅ onnxopt: all models passed"
        if not failed
        else f"❌ onnxopt: {failed} of {len(outcomes)} model(s) failed"
    )
    lines = [
        f"### {head}",
        "",
        "| model | nodes | change | validation | max abs err | status |",
        "|---|---:|---:|---|---:|---|",
    ]
    for o in outcomes:
        if o.report is None:
            lines.append(f"| `{_markdown_cell(o.model)}` | - | - | - | - | error |")
            continue
        r = o.report
        change = (
            f"{(r.after.nodes - r.before.nodes) / r.before.nodes:+.1%}" if r.before.nodes else "-"
        )
        if r.validation is None:
            validation, worst = "skipped", "-"
        else:
            validation = "ok" if r.validation.passed else "**mismatch**"
            worst = f"{max((x.max_abs for x in r.validation.outputs), default=0.0):.2g}"
        lines.append(
            f"| `{_markdown_cell(o.model)}` | {r.before.nodes} → {r.after.nodes} | {change} | {validation} | {worst} | {o.status} |"
        )
    problems = [
        (o.model, line) for o in outcomes for line in ((o.error,) if o.error else o.failures)
    ]
    if problems:
        lines.append("")
        lines.extend(
            f"- `{_markdown_cell(model)}`: {_CONTROL.sub(_escape_char, line)}"
            for model, line in problems
        )
    return "\n".join(lines) + "\n"
