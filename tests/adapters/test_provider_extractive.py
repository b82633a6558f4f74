"""The offline extractive provider: what it quotes, and under which handle."""

from __future__ import annotations

import re

from retrieval_host.adapters.provider_extractive import DECLINED, LABEL, ExtractiveProvider
from retrieval_host.core.cancel import CancelToken
from retrieval_host.core.models import Location
from retrieval_host.core.run_ports import EvidencePassage, GenerationRequest, TextDelta
from retrieval_host.core.runs.citations import check_citations
from retrieval_host.core.runs_model import CitationPolicy


def _passage(handle: str, text: str) -> EvidencePassage:
    return EvidencePassage(handle, "torque", "r1", "Torque", Location(start_line=1), text)


def _message(handle: str, text: str) -> EvidencePassage:
    where = Location(start_line=1, document_id=f"<{handle}@lists.example.org>")
    return EvidencePassage(handle, "thread", "r1", "Thread", where, text)


def _page(handle: str, page: int, text: str, start_line: int = 1) -> EvidencePassage:
    where = Location(page=page, start_line=start_line)
    return EvidencePassage(handle, "manual", "r1", "Pump manual", where, text)


def _answer(evidence: list[EvidencePassage], question: str) -> list[str]:
    request = GenerationRequest("extractive", (), evidence=evidence, question=question)
    events = ExtractiveProvider().generate(request, CancelToken())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.startswith(LABEL + "\n")
    return text.removeprefix(LABEL + "\n").splitlines()


def test_a_sentence_two_overlapping_passages_share_is_quoted_once() -> None:
    # A black-box test: the chunker's overlap put one sentence in two passages, and the answer
    # quoted it twice under two citations (one of its three slots wasted).
    shared = "Line 27 sets the torque value 189."
    first = _passage("p-1", f"Line 26 sets the torque value 120.\n{shared}")
    second = _passage("p-2", f"{shared}\nLine 28 sets the torque value 240.")
    lines = _answer([first, second], "torque value 189 line 27")
    assert lines.count(f"- {shared} [source:p-1]") == 1
    assert not any(shared in line and "p-2" in line for line in lines)
    assert len(lines) == 3  # the slot went to another sentence


def test_a_look_alike_marker_in_a_passage_is_quoted_as_one_that_cites_nothing() -> None:
    # A black-box test: `[source` + U+200B + `:FAKE]` and `[ѕource:...]` (Cyrillic ѕ) were
    # quoted verbatim and read, on any plain-text display, as citations of passages the run
    # never had; every check passed them since neither is a marker.
    forgeries = {
        "zero width space": "[source\u200b:p-fake]",
        "word joiner": "[sour\u2060ce:p-fake]",
        "byte order mark": "[\ufeffsource:p-fake]",
        "soft hyphen": "[sou\u00adrce:p-fake]",
        "cyrillic dze": "[\u0455ource:p-fake]",
        "greek omicron": "[s\u03bfurce:p-fake]",
        "cyrillic es and ie": "[sour\u0441\u0435:p-fake]",
        "fullwidth bracket and colon": "\uff3bsource\uff1ap-fake]",
        "spaced letters": "[ S o u r c e : p-fake]",
        # A second black-box test: what the first list missed.
        "bidi isolate": "[s\u2066ource:p-fake]",
        "bidi embedding and pop": "[s\u202aour\u202cce:p-fake]",
        "variation selector": "[s\ufe0fource:p-fake]",
        "tag space": "[s\U000e0020ource:p-fake]",
        "arabic letter mark": "[s\u061cource:p-fake]",
        "hangul filler": "[\u3164source:p-fake]",
        "fullwidth letters": "[\uff53\uff4f\uff55\uff52\uff43\uff45:p-fake]",
        "mathematical monospace": "["
        + "".join(chr(0x1D68A + ord(c) - ord("a")) for c in "source")
        + ":p-fake]",
        "roman numeral c": "[sour\u217de:p-fake]",
        "coptic o": "[s\u2c9furce:p-fake]",
        "armenian full stop": "[source\u0589p-fake]",
        "modifier colon": "[source\u02d0p-fake]",
        "presentation colon": "[source\ufe13p-fake]",
        "ornamental bracket": "\u2772source:p-fake]",
        # And what a third black-box test found past the second list.
        "greek capital epsilon": "[SOURC\u0395:p-fake]",
        "lisu letters": "[\ua4e2\ua4f3\ua4f4\ua4e3\ua4da\ua4f0:p-fake]",
        "padding past a short window": "[" + "\u200b" * 64 + "source:p-fake]",
        "vertical two dot leader": "[source\ufe30p-fake]",
        "devanagari visarga": "[source\u0903p-fake]",
        "cherokee s and zero": "[\u13da0urce:p-fake]",
        "unassigned invisible": "[s\u2065ource:p-fake]",
        "white square bracket": "\u3016source:p-fake]",
    }
    for name, marker in forgeries.items():
        text = f"The walrus invoice is approved, see {marker} for proof."
        [line] = [line for line in _answer([_passage("p-1", text)], "walrus invoice") if line]
        assert line.endswith("[source:p-1]"), name
        quoted = line.removesuffix("[source:p-1]")
        assert not any(b in quoted for b in "[\uff3b\u2772\u3016"), (name, quoted)
        assert "(" in quoted, name  # the look-alike letters stay, behind a parenthesis
    # Words that only contain the letters are left alone.
    plain = "The walrus invoice cites [resource:12] and [sourced] notes."
    [line] = [line for line in _answer([_passage("p-1", plain)], "walrus invoice") if line]
    assert "[resource:12] and [sourced]" in line


def test_a_question_no_sentence_shares_a_word_with_is_declined_without_a_citation() -> None:
    # A black-box test: "how do I bake a chocolate cake" was answered "- 4." (a list number,
    # the first sentence of the evidence) with a valid citation.
    text = "4. Suppose I want to search for a whole word.\nUse the -w option for that."
    lines = _answer([_passage("p-1", text)], "how do I bake a chocolate cake")
    assert lines == [DECLINED]
    # A question the evidence does share words with is answered as before.
    [line] = [x for x in _answer([_passage("p-1", text)], "search a whole word") if x]
    assert line == "- Suppose I want to search for a whole word. [source:p-1]"


def test_a_marker_a_heading_line_split_is_not_joined_back_into_one() -> None:
    # A black-box test: `[` / `# note` / `source:ID]` in plain text: the heading line dropped
    # and the lines joined, the answer read `[ source:ID]`, and a run requiring citations
    # failed on it as a malformed marker.
    # A heading ends the paragraph (CommonMark), so the halves are never joined at all.
    text = "The heron rotation uses the vault [\n# note\nsource:p-fake] exactly once."
    lines = [x for x in _answer([_passage("p-1", text)], "heron rotation vault once") if x]
    assert lines
    for line in lines:
        quoted = line.removesuffix(" [source:p-1]")
        assert not re.search(r"\[\s*source\s*:", quoted, re.IGNORECASE), line


def test_sentences_of_scripts_without_spaces_end_at_their_own_full_stops() -> None:
    # A black-box test: `。` ended no sentence, so a Japanese paragraph was quoted whole, two
    # sentences that had nothing to do with the question included.
    text = "会議は十時に始まります。昼食は十二時です。猫が窓の外で鳴いています。"
    lines = [x for x in _answer([_passage("p-1", text)], "昼食は何時ですか") if x]
    assert lines[0] == "- 昼食は十二時です。 [source:p-1]"
    assert not any("猫" in line for line in lines)
    hindi = "दिल्ली भारत की राजधानी है। मुंबई एक बड़ा शहर है।"
    lines = [x for x in _answer([_passage("p-2", hindi)], "राजधानी दिल्ली") if x]
    assert lines[0] == "- दिल्ली भारत की राजधानी है। [source:p-2]"


def test_a_closing_quote_after_a_full_stop_stays_with_its_sentence() -> None:
    # A black-box test: `。` ended the sentence before its closing quote, so the answer quoted
    # an opening mark with no closing one.
    text = "他说：“价格很好。”我们明天再谈。「会議室は三階です。」と彼は言った。"
    lines = [x for x in _answer([_passage("p-1", text)], "价格 会議室") if x]
    assert "- 他说：“价格很好。” [source:p-1]" in lines
    assert "- 「会議室は三階です。」 [source:p-1]" in lines


def test_a_word_only_the_heading_holds_answers_with_the_sentences_under_it() -> None:
    # Probe Q: `loadavg` is named only in its section's heading; the top hit was declined as
    # sharing no word with the question, and `os.loadavg` quoted sentences sharing "os".
    text = (
        "## `os.loadavg()`\n\n* Returns: {number\\[]}\n\n"
        "Returns an array containing the 1, 5, and 15 minute load averages.\n\n"
        "## `os.machine()`\n\nReturns the machine type as a string."
    )
    other = _passage("p-2", "The `node:os` module provides operating system utilities.")
    lines = [x for x in _answer([_passage("p-1", text), other], "loadavg") if x]
    assert lines and all(line.endswith("[source:p-1]") for line in lines), lines
    assert "- Returns an array containing the 1, 5, and 15 minute load averages. [source:p-1]" in (
        lines
    )
    assert not any("machine type" in line for line in lines)
    lines = [x for x in _answer([other, _passage("p-1", text)], "os.loadavg") if x]
    assert any("load averages" in line for line in lines), lines


def test_code_blocks_are_never_quoted_blank_lines_and_all() -> None:
    # Probe Q: a blank line inside a fenced block split it, and its second half was quoted as
    # prose with the closing fence.
    text = (
        "Split the PATH variable with path.delimiter.\n\n"
        "```js\nconsole.log(process.env.PATH);\n\n"
        "process.env.PATH.split(path.delimiter);\n```\n\n"
        "The delimiter is ; on Windows and : on POSIX."
    )
    lines = [x for x in _answer([_passage("p-1", text)], "split PATH delimiter") if x]
    assert lines == [
        "- Split the PATH variable with path.delimiter. [source:p-1]",
        "- The delimiter is ; on Windows and : on POSIX. [source:p-1]",
    ]
    # A passage cut from inside a block begins with its closing fence.
    tail = "split(path.delimiter);\n```\n\nThe PATH delimiter differs by platform."
    lines = [x for x in _answer([_passage("p-2", tail)], "PATH delimiter") if x]
    assert lines == ["- The PATH delimiter differs by platform. [source:p-2]"]


def test_a_rare_word_the_answer_shares_outweighs_common_ones_others_share() -> None:
    # Probe Q: "Why was seccomp turned off in the file package?" quoted other packages'
    # changelog lines sharing "file" and "package", not the one message about seccomp.
    common = [
        _passage(f"p-{n}", f"Update the {name} package to build every file again.")
        for n, name in enumerate(("binutils", "systemd", "make", "tar"))
    ]
    answer = _passage("p-9", "Explicitly disable seccomp support. Closes: #948522.")
    lines = [
        x for x in _answer([*common, answer], "why was seccomp turned off in the file package") if x
    ]
    assert "- Explicitly disable seccomp support. [source:p-9]" in lines, lines
    # Equal scores go to the passage the search ranked first.
    ranked = [_passage(f"p-{c}", f"Walrus note {c}.") for c in "dcba"]
    lines = [x for x in _answer(ranked, "walrus") if x]
    assert [line.rsplit(" ", 1)[1] for line in lines] == [
        "[source:p-d]",
        "[source:p-c]",
        "[source:p-b]",
    ]


def test_a_passage_that_opens_a_bare_block_and_is_cut_quotes_its_prose_not_its_code() -> None:
    # Probe V: an unpaired bare fence was taken for the end of a block the passage began in,
    # so the prose before it went unquoted and the code after it was quoted.
    code = "\n".join(f"option_{i} = value_{i}  # configure widget option {i}" for i in range(8))
    opens = (
        "## Configuring the widget\n\n"
        f"To configure the widget, edit widget.conf as shown below.\n\n```\n{code}"
    )
    lines = [x for x in _answer([_passage("p-1", opens)], "configure the widget") if x]
    assert lines == ["- To configure the widget, edit widget.conf as shown below. [source:p-1]"]
    # The passage after it begins inside the block, and ends it.
    ends = f"{code}\n```\n\nThen restart the widget service."
    lines = [x for x in _answer([_passage("p-2", ends)], "configure the widget service") if x]
    assert lines == ["- Then restart the widget service. [source:p-2]"]


def test_markdown_structure_is_read_as_commonmark_reads_it() -> None:
    # Probe V: a ``` line inside a ~~~ block closed it; indented code and a setext heading's
    # underline were quoted; a `#include` line was taken for a heading.
    text = (
        "~~~\n```\nnested widget code\n~~~\n\n"
        "Widget setup\n============\n\n"
        "    widget.configure(mode='fast')\n\n"
        "#include <widget.h> is needed to use the widget.\n\n"
        "# apt-get install widget\n\n"
        "The widget starts at boot."
    )
    lines = [x for x in _answer([_passage("p-1", text)], "widget nested install include") if x]
    quoted = " ".join(lines)
    assert "nested widget code" not in quoted and "configure(" not in quoted
    assert "=====" not in quoted
    assert "- #include <widget.h> is needed to use the widget. [source:p-1]" in lines
    # `# apt-get install widget` is a heading (a `#`, then a space): not quoted.
    assert not any("apt-get" in line for line in lines)


def test_a_heading_sharing_one_of_several_question_words_answers_nothing_alone() -> None:
    # Probe V: "Which troubleshooting tips exist for my bicycle?" was answered from a
    # Troubleshooting section whose sentences share no word with it.
    text = "## Troubleshooting\n\nSearches return nothing: check the authorizer."
    lines = [
        x
        for x in _answer([_passage("p-1", text)], "which troubleshooting tips exist for my bicycle")
        if x
    ]
    assert lines == [DECLINED]


def test_one_rare_word_outweighs_two_words_many_sentences_hold() -> None:
    # Probe V: with `log(1 + N/n)`, sentences sharing "file" and "package" (4 of 9 each)
    # still pushed out the one sentence sharing "seccomp".
    common = _passage(
        "p-1",
        " ".join(f"The {n} package file is rebuilt." for n in ("zlib", "tar", "make", "gzip")),
    )
    other = _passage("p-2", "The daemon logs. The daemon waits. The daemon forks. It stops.")
    rare = _passage("p-3", "Enable seccomp filtering for the daemon with the --seccomp flag.")
    lines = [x for x in _answer([common, other, rare], "which package file turns on seccomp") if x]
    assert any("seccomp filtering" in line for line in lines), lines


def test_quote_marks_are_not_quoted_and_a_change_of_quote_depth_ends_a_sentence() -> None:
    # Probe D: 36 of 50 answers from a mail archive quoted `>` marks inside their sentences
    # ("- > > > > When the number of data points is odd, ..."), a reply's first line fused
    # with the quoted text below it.
    reply = _message(
        "m-2",
        "Thanks, that explains the median\n"
        "> > When the number of data points is odd, the middle\n"
        "> > value is returned.\n"
        ">> When it is even, the smaller of the two middle values is returned.\n"
        "> Good to know for data points.",
    )
    lines = [x for x in _answer([reply], "number of data points odd even middle value") if x]
    assert lines == [
        "- When the number of data points is odd, the middle value is returned. [source:m-2]",
        "- When it is even, the smaller of the two middle values is returned. [source:m-2]",
        "- Good to know for data points. [source:m-2]",
    ]
    # A PDF's text is the page's own: a `>` there is no quote mark.
    page = _page("p-1", 1, "> 100 ms of latency raises an alert.")
    assert _answer([page], "latency alert") == [
        "- > 100 ms of latency raises an alert. [source:p-1]"
    ]


def test_attribution_lines_are_neither_quoted_nor_fused_with_the_quote() -> None:
    # Probe D: "Carol Diaz wrote: > Collapse and truncate the given text ..." was quoted as one
    # sentence, and "On Mon, ..., Bob Lindqvist wrote: > Hi Alice, > > the docstring ..." too.
    text = (
        "Carol Diaz wrote:\n"
        "> Collapse and truncate the given text to fit in the given width.\n\n"
        "On Mon, 04 Mar 2024 10:00:00 +0000, Bob Lindqvist <bob@example.org>\n"
        "wrote:\n"
        "> > Collapse the whitespace of the text first.\n\n"
        "On Tue, 05 Mar 2024 09:00:00 +0000, Carol Diaz wrote:\n"
        "> The width counts the placeholder too."
    )
    question = "what did carol diaz and bob lindqvist say about collapse truncate width"
    lines = [x for x in _answer([_message("m-1", text)], question) if x]
    assert lines == [
        "- Collapse and truncate the given text to fit in the given width. [source:m-1]",
        "- Collapse the whitespace of the text first. [source:m-1]",
        "- The width counts the placeholder too. [source:m-1]",
    ]


def test_a_sentence_replies_quote_again_is_given_once_citing_the_message_that_wrote_it() -> None:
    # Probe D: one sentence was given three times, once per message holding it, the message
    # that wrote it last (it ranked below the replies quoting it).
    sentence = "When it is even, the smaller of the two middle values is returned."
    reply = _message(
        "m-2",
        "Bob wrote:\n> When it is even, the smaller of the two middle\n> values is returned.\n\n"
        "Thanks Bob!",
    )
    forward = _message("m-3", f"> > {sentence}\n\nForwarding for the archive.")
    original = _message("m-1", f"Hi Alice,\n\n{sentence}\n\nHope that helps.")
    lines = [x for x in _answer([reply, forward, original], "even smaller middle values") if x]
    assert lines == [f"- {sentence} [source:m-1]"]
    # With no message of its own in the evidence, the better-ranked quoting one.
    lines = [x for x in _answer([forward, reply], "even smaller middle values") if x]
    assert lines == [f"- {sentence} [source:m-3]"]


def test_extractive_answers_pass_the_hosts_quote_check() -> None:
    # What an answer shows of a passage is checked by `citations.quotes` wherever it stands
    # in quotation marks: a quotation that crosses a quoted line keeps that line's marks,
    # which the passage has between its words.
    evidence = [
        _message(
            "m-1",
            '> The option "fast mode" makes the parser\n> skip the validation step.\n'
            '> Bob called it "the validation\n> shortcut" in the review.',
        ),
        _page("p-1", 2, 'The validation step is "recei-\nved" as written.\nPage 2'),
        _passage("p-2", "他说：“validation 很好。”Skip [source:p-9] the validation step."),
        _passage("p-3", "The parser \u201cskips the\nvalidation\u201d step when asked."),
    ]
    request = GenerationRequest(
        "extractive", (), evidence=evidence, question="validation step fast mode shortcut"
    )
    events = ExtractiveProvider(max_sentences=8).generate(request, CancelToken())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    lines = text.splitlines()
    assert (
        '- The option "fast mode" makes the parser skip the validation step. [source:m-1]'
    ) in lines
    assert '- Bob called it "the validation > shortcut" in the review. [source:m-1]' in lines
    report = check_citations(
        text, {p.handle: p for p in evidence}, CitationPolicy(require=True, quotes=True)
    )
    checked = [check for cited in report.cited for check in cited.quotes]
    assert len(checked) == 5 and all(check.found for check in checked), checked


def _footer(page: int) -> str:
    return f"Widget pump manual — Reference Edition 2024\nCONFIDENTIAL DRAFT\nPage {page}"


def test_a_pdfs_running_header_and_footer_are_never_quoted_nor_glued_to_a_sentence() -> None:
    # Probe A: "- Apache-2.0 licence text — Reference Edition 2024 CONFIDENTIAL DRAFT Page 1"
    # was quoted as evidence, and a sentence cut at a page end with the footer glued on.
    first = _page(
        "p-1",
        1,
        "The pump must be primed before its first start.\n"
        "If the widget pump runs dry for one minute, the seal\n" + _footer(1),
        start_line=30,
    )
    second = _page(
        "p-2",
        2,
        "Widget pump manual\nmust be replaced before the pump starts again.\n"
        "The seal kit of the widget pump is part 4711.\n" + _footer(2),
    )
    third = _page(
        "p-3",
        3,
        "Widget pump manual\nThe seal kit of the widget pump is part 4712.\n"
        "Check the seal every 500 hours. Check the seal every 500 hours.",
    )
    question = "widget pump manual reference edition: when is the seal replaced if it runs dry"
    lines = [x for x in _answer([first, second, third], question) if x]
    quoted = " ".join(lines)
    for boilerplate in ("Reference Edition", "CONFIDENTIAL", "Page", "Widget pump manual"):
        assert boilerplate not in quoted, lines
    # The sentence a page end cut ends before the footer, and the next page's part of it
    # starts after the header.
    assert "- If the widget pump runs dry for one minute, the seal [source:p-1]" in lines
    assert "- must be replaced before the pump starts again. [source:p-2]" in lines
    # A line that repeats (digits aside) mid-page, or at the end of passages that end
    # differently (a footer ends its pages alike), or twice on one page is text: it is quoted.
    fourth = _page("p-4", 4, "The seal kit of the widget pump is part 4713.", start_line=12)
    lines = [x for x in _answer([first, second, third, fourth], "seal kit part") if x]
    assert lines == [
        f"- The seal kit of the widget pump is part {n}. [source:p-{page}]"
        for n, page in ((4711, 2), (4712, 3), (4713, 4))
    ]
    lines = [x for x in _answer([first, second, third], "seal every 500 hours") if x]
    assert "- Check the seal every 500 hours. [source:p-3]" in lines
    # Nor is there a header at the top of a passage that begins mid-page.
    mid_page = _page("p-4", 4, "The seal kit of the widget pump is part 4713.\nIt has one.", 12)
    top = _page("p-5", 5, "The seal kit of the widget pump is part 4715.\nIt has two gaskets.")
    lines = [x for x in _answer([mid_page, top], "seal kit part") if x]
    assert lines == [
        "- The seal kit of the widget pump is part 4713. [source:p-4]",
        "- The seal kit of the widget pump is part 4715. [source:p-5]",
    ]
    # With one page of the source in the evidence nothing shows the footer repeats.
    lines = [x for x in _answer([first], "widget pump manual edition") if x]
    assert any("CONFIDENTIAL DRAFT" in line for line in lines), lines


def test_lines_that_end_one_page_and_begin_the_next_are_text_not_a_footer() -> None:
    # Probe A's evidence: two classes with one docstring end a page's passage and begin the
    # next page's; unlike its footer, that is the text (and is quoted).
    docstring = "Action objects are used by a parser to represent one command line argument."
    ends = _page("p-1", 1, f"The Action class.\n{docstring}", start_line=1)
    footer = _page("p-2", 1, f"Keyword arguments follow.\n{_footer(1)}", start_line=20)
    begins = _page("p-3", 2, f"{docstring}\nKeyword Arguments:\n{_footer(2)}")
    lines = [x for x in _answer([ends, footer, begins], "widget manual action objects parser") if x]
    assert f"- {docstring} [source:p-1]" in lines
    assert not any("Widget pump manual" in line for line in lines), lines


def test_a_leading_greater_than_sign_is_a_quote_mark_only_in_mail() -> None:
    # Probe W: every passage without a page was read as mail, so plain text, HTML and Markdown
    # lost a leading `>`: ">5 mg/kg of compound X is lethal" was quoted "5 mg/kg ...", which
    # says something else, and a REPL's `>>> import os` line lost its prompt.
    dose = "Toxicity of compound X.\n>5 mg/kg of compound X is lethal to rats.\n<1 mg/kg is safe."
    lines = _answer([_passage("p-1", dose)], "how many mg/kg of compound X is lethal")
    assert "- >5 mg/kg of compound X is lethal to rats. [source:p-1]" in lines, lines
    session = "Example session:\n>>> import os\n>>> os.getcwd() returns the current directory."
    lines = _answer([_passage("p-2", session)], "getcwd current directory")
    assert lines == [
        "- Example session: >>> import os >>> os.getcwd() returns the current directory."
        " [source:p-2]"
    ]
    # Nor is a line saying who wrote something taken for a mail attribution there.
    said = "Carol Diaz wrote:\nThe 5 mg/kg dose is lethal to rats."
    lines = _answer([_passage("p-3", said)], "carol diaz lethal dose")
    assert lines == ["- Carol Diaz wrote: The 5 mg/kg dose is lethal to rats. [source:p-3]"]
    # In a message (its location names it) the marks are still its quote depth.
    lines = _answer([_message("m-1", dose)], "how many mg/kg of compound X is lethal")
    assert "- 5 mg/kg of compound X is lethal to rats. [source:m-1]" in lines, lines


def test_only_a_page_number_ending_a_line_is_set_aside_in_finding_a_running_header() -> None:
    # Probe W: with every figure masked, lines that differ only in their figures were taken
    # for a running header or footer and never quoted, and the run declined.
    pumps = [
        _page("p-1", 1, "Model P-100 pumps deliver at most 40 litres per minute.\nFor ponds."),
        _page("p-2", 2, "Model P-200 pumps deliver at most 95 litres per minute.\nFor tanks."),
    ]
    lines = _answer(pumps, "how many litres per minute does model P-200 deliver")
    assert "- Model P-200 pumps deliver at most 95 litres per minute. [source:p-2]" in lines
    serviced = [
        _page(f"p-{n}", n, f"The pump must be serviced every {n * 3} months in zone {n}.\nMore.")
        for n in (1, 2, 3)
    ]
    lines = _answer(serviced, "how often must the pump be serviced months zone")
    assert lines == [
        f"- The pump must be serviced every {n * 3} months in zone {n}. [source:p-{n}]"
        for n in (1, 2, 3)
    ]
    totals = [
        _page(
            f"p-{n}",
            n,
            f"Valve list for section {n}.\nTotal pressure loss in section {n}: {n * 7} kPa.",
        )
        for n in (1, 2)
    ]
    lines = _answer(totals, "total pressure loss kPa")
    assert lines == [
        f"- Total pressure loss in section {n}: {n * 7} kPa. [source:p-{n}]" for n in (1, 2)
    ]
    warnings = [
        _page(f"p-{n}", n, f"Warning: never open the valve under pressure {n}.") for n in (1, 2)
    ]
    lines = _answer(warnings, "never open the valve under pressure")
    assert lines == [
        f"- Warning: never open the valve under pressure {n}. [source:p-{n}]" for n in (1, 2)
    ]
    # A header that ends with its page number, however it is written, is still one.
    header = "Apache-2.0 licence text — Reference Edition 2024 CONFIDENTIAL DRAFT"
    forms = ("Page {}", "p. {}", "{}", "- {} -", "{} of 12", "{}/12", "| Page {}", "— {}")
    for form in forms:
        pages = [
            _page(f"p-{n}", n, f"{header} {form.format(n)}\nThe licence text of part {n}.")
            for n in (1, 3)
        ]
        lines = _answer(pages, "licence text reference edition")
        assert lines == [f"- The licence text of part {n}. [source:p-{n}]" for n in (1, 3)], form
