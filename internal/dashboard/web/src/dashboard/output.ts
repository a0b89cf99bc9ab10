// A command's output shown in a <pre>, bounded: text nodes only (output is the workload's, so
// it is never parsed as HTML), each stream decoded as UTF-8 across chunk boundaries, and the
// oldest text dropped past maxChars so that a flood cannot exhaust the page.
import { decodeBase64 } from './api';

export const MAX_OUTPUT_CHARS = 512 * 1024;

export class OutputView {
  private decoders = new Map<string, TextDecoder>();
  private chars = 0;
  // Text not in the page yet: written once per animation frame, so that a flood of small
  // chunks costs one layout a frame rather than one per chunk.
  private pending: { cls: string; text: string }[] = [];
  private pendingChars = 0;
  private frame = 0;

  constructor(
    readonly el: HTMLElement,
    private readonly maxChars = MAX_OUTPUT_CHARS,
  ) {}

  clear(): void {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.pending = [];
    this.pendingChars = 0;
    this.el.replaceChildren();
    delete this.el.dataset.dropped;
    this.decoders.clear();
    this.chars = 0;
  }

  // chunk appends a chunk of a stream, given as base64.
  chunk(stream: string, dataBase64: string): void {
    let d = this.decoders.get(stream);
    if (!d) {
      d = new TextDecoder('utf-8');
      this.decoders.set(stream, d);
    }
    this.text(d.decode(decodeBase64(dataBase64), { stream: true }), stream.toLowerCase());
  }

  // note appends a line of the page's own (a gap, an exit status), set apart from the output.
  note(text: string): void {
    const last = this.pending.at(-1)?.text ?? this.el.lastChild?.textContent ?? '';
    this.text(`${last === '' || last.endsWith('\n') ? '' : '\n'}[${text}]\n`, 'note');
  }

  private text(s: string, cls: string): void {
    if (s === '') return;
    const last = this.pending.at(-1);
    if (last && last.cls === cls) last.text += s;
    else this.pending.push({ cls, text: s });
    this.pendingChars += s.length;
    // What is pending beyond the cap would be dropped at once: drop it now.
    while (this.pendingChars > this.maxChars) {
      const first = this.pending[0];
      const excess = this.pendingChars - this.maxChars;
      if (first.text.length > excess) {
        first.text = first.text.slice(excess);
        this.pendingChars -= excess;
      } else {
        this.pending.shift();
        this.pendingChars -= first.text.length;
      }
      this.el.dataset.dropped = 'true';
    }
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  private flush(): void {
    this.frame = 0;
    const stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
    for (const { cls, text } of this.pending) {
      const last = this.el.lastChild as HTMLElement | null;
      if (last && last.className === cls && last.firstChild instanceof Text) last.firstChild.appendData(text);
      else {
        const span = document.createElement('span');
        span.className = cls;
        span.textContent = text;
        this.el.append(span);
      }
      this.chars += text.length;
    }
    this.pending = [];
    this.pendingChars = 0;
    this.trim();
    if (stick) this.el.scrollTop = this.el.scrollHeight;
  }

  private trim(): void {
    while (this.chars > this.maxChars && this.el.firstChild) {
      const first = this.el.firstChild;
      const len = first.textContent?.length ?? 0;
      const excess = this.chars - this.maxChars;
      if (len > excess && first.firstChild instanceof Text) {
        first.firstChild.deleteData(0, excess);
        this.chars -= excess;
      } else {
        first.remove();
        this.chars -= len;
      }
      this.el.dataset.dropped = 'true';
    }
  }
}
