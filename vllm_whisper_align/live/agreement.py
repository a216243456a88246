"""LocalAgreement-2 over timed words: a word is confirmed once two consecutive decodes of the growing
buffer both say it, in the same place of their text (ufal/whisper_streaming's ``HypothesisBuffer``).

Each decode's words (absolute times) are compared with the previous decode's unconfirmed tail: their
longest common prefix (word texts equal, case and punctuation aside) is confirmed, with the texts and
times of the newer decode (it heard more of what follows each word, so its DTW places the word better);
the rest becomes the tail the next decode is compared with. One word read two ways at the same place,
between words both decodes agree on, is confirmed as the newer decode reads it
(:meth:`Agreement._reread`); a word one of them heard and the other skipped, where both go on alike, is
confirmed too (:meth:`Agreement._skips`). A decode's words up to the last confirmed word, where it says
that word again at its place, belong to text already confirmed (else those that start before that word
ended), and a decode that repeats the last confirmed words at its start (the buffer still holds their
audio) has the repetition dropped. A decode's last word waits until a decode has heard a little past it.
A word the previous decode heard past where the newer one's text ended, on audio that holds speech,
stays in the tail (:meth:`Agreement._unanswered`): the newer decode neither agreed nor disagreed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vllm_whisper_align.align.words import Word, normalise

# A decode's word that starts this long before the last confirmed word's end still counts as new
# (DTW places the same boundary a little differently in each decode).
OVERLAP_S = 0.1
# Two decodes' words this close in start are at the same place (Agreement._reread).
SAME_PLACE_S = 0.2
# A decode whose first word starts within this of the last confirmed end may repeat confirmed words.
REPEAT_WITHIN_S = 1.0
# The longest repetition of confirmed words looked for at a decode's start.
MAX_REPEAT_WORDS = 5
# A decode's last word is confirmed only if the decode heard this long after its end (about a word):
# Whisper ends its text with a period where the audio ends, and the audio after the last word may be a
# word begun that it does not write yet ("My sister." "plays." from decodes 0.5 s apart).
LAST_WORD_HEARD_AFTER_S = 0.8


def same_word(a: Word, b: Word) -> bool:
    """Two readings of one word: equal once normalised ("mat" and "Mat." agree: a decode that hears
    the next sentence start puts the period and capital there), exactly equal if nothing is left."""
    key = normalise(a.word)
    return key == normalise(b.word) if key else a.word.strip() == b.word.strip()


def at_same_place(a: Word, b: Word) -> bool:
    """Two decodes' words that start within SAME_PLACE_S of each other."""
    return abs(a.start - b.start) <= SAME_PLACE_S


@dataclass
class Agreement:
    """What is confirmed so far, and the tail the next decode is compared with."""

    # The previous decode's words that are not confirmed yet.
    tail: list[Word] = field(default_factory=list)
    # Confirmed words whose audio is still in the buffer (a decode says them again).
    in_buffer: list[Word] = field(default_factory=list)
    confirmed_end: float = 0.0

    def confirm(
        self,
        words: Sequence[Word],
        heard_until: float = math.inf,
        spoken: Callable[[Word], bool] | None = None,
    ) -> list[Word]:
        """The words of a new decode (which heard the stream up to ``heard_until``) that it and the
        previous one agree on, confirmed now; its last word waits if the decode ends right after it.
        ``spoken`` says whether the audio holds speech where a word lies (:meth:`_unanswered`)."""
        new = self._new_words(words)
        held = 1 if new and heard_until - new[-1].end < LAST_WORD_HEARD_AFTER_S else 0
        confirmed: list[Word] = []
        while len(new) > held and self.tail:
            if same_word(new[0], self.tail[0]) or self._reread(new, self.tail):
                confirmed.append(new.pop(0))
                self.tail.pop(0)
            elif self._skips(new, self.tail):
                confirmed.append(self.tail.pop(0))
            elif self._skips(self.tail, new):
                confirmed.append(new.pop(0))
            else:
                break
        self.tail = new + self._unanswered(words, spoken)
        self._take(confirmed)
        return confirmed

    def _unanswered(self, words: Sequence[Word], spoken: Callable[[Word], bool] | None) -> list[Word]:
        """The previous decode's unconfirmed words that start after the new decode's last word ends,
        where ``spoken`` says the audio holds speech: kept for the next decode to agree with. The new
        decode wrote nothing there, neither the word nor another: Whisper now and then ends a decode
        before the last words it heard the step before ("the worm." where the decode before heard "the
        worm mat."), and where the stream's last decode did so the word was lost. Words the previous
        decode wrote into silence ("Thank you.") go, as before, and so do all its words where the new
        decode wrote none: that one heard no speech it could read (on a stream's first second, the
        previous decode's "Addy." for a cut-off "Had he")."""
        if spoken is None or not words:
            return []
        return [word for word in self.tail if word.start >= words[-1].end and spoken(word)]

    @staticmethod
    def _reread(new: list[Word], tail: list[Word]) -> bool:
        """The two decodes read one word differently at the same place, and agree on the next: the word
        is confirmed as the newer decode reads it. Small models flip between two readings of a word
        from one decode to the next ("The", "A"), and by LocalAgreement alone such a word would hold up
        everything behind it until the window is full."""
        return (
            len(new) > 1
            and len(tail) > 1
            and at_same_place(new[0], tail[0])
            and same_word(new[1], tail[1])
            and at_same_place(new[1], tail[1])
        )

    @staticmethod
    def _skips(some: list[Word], other: list[Word]) -> bool:
        """``some`` goes on, at the same place, as ``other`` does after its first word: that word was
        heard by one decode and skipped by the other. Small models drop a word from one decode to the
        next ("there might be prudently in", "there might be in") more often than they invent one
        inside speech, and by LocalAgreement alone the word is lost once two decodes skip it."""
        after = other[1:3]
        return (
            len(some) >= len(after) > 0
            and all(same_word(a, b) for a, b in zip(some, after, strict=False))
            and at_same_place(some[0], other[1])
        )

    def confirm_tail(self) -> list[Word]:
        """The unconfirmed tail, confirmed as it is: the audio has ended, no decode will come after."""
        confirmed, self.tail = self.tail, []
        self._take(confirmed)
        return confirmed

    def confirm_before(self, seconds: float) -> list[Word]:
        """The tail's words that end by ``seconds``, confirmed as they are (their audio is going)."""
        count = next((i for i, word in enumerate(self.tail) if word.end > seconds), len(self.tail))
        confirmed, self.tail = self.tail[:count], self.tail[count:]
        self._take(confirmed)
        return confirmed

    def forget_before(self, seconds: float) -> None:
        """The buffer no longer holds the audio before ``seconds``: nothing there is said again."""
        self.in_buffer = [word for word in self.in_buffer if word.end > seconds]
        self.tail = [word for word in self.tail if word.start >= seconds]

    def _take(self, confirmed: list[Word]) -> None:
        if confirmed:
            self.in_buffer += confirmed
            self.confirmed_end = confirmed[-1].end

    def _new_words(self, words: Sequence[Word]) -> list[Word]:
        """``words`` without those the confirmed text already holds: those up to the last confirmed
        word, where the decode says it again at its place; else those that start before it ended. The
        text comes first because DTW places a word a little differently in each decode, and a
        confirmed word that ended late would otherwise swallow the next ("rather" at 3.44-3.75 s, then
        "rather" 3.44-3.62 and "selfish" from 3.62)."""
        if self.in_buffer:
            last = self.in_buffer[-1]
            again = [i for i, word in enumerate(words) if same_word(word, last) and at_same_place(word, last)]
            if again:
                return list(words[min(again, key=lambda i: abs(words[i].start - last.start)) + 1 :])
        new = [word for word in words if word.start > self.confirmed_end - OVERLAP_S]
        if not new or not self.in_buffer or abs(new[0].start - self.confirmed_end) >= REPEAT_WITHIN_S:
            return new
        for count in range(1, min(len(self.in_buffer), len(new), MAX_REPEAT_WORDS) + 1):
            said = self.in_buffer[-count:]
            if all(same_word(a, b) for a, b in zip(said, new[:count], strict=True)):
                return new[count:]
        return new
