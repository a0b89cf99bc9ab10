// A command's output shown in a <pre>, bounded: text nodes only (output is the workload's, so
// it is never parsed as HTML), each stream decoded as UTF-8 across chunk boundaries, and the
// oldest text dropped past maxChars so that a flood cannot exhaust the page.
import { decodeBase64 } from './api';

export const MAX_OUTPUT_CHARS = 512 * 1024;

export class OutputView {
  private decoders = new Map<string, TextDecoder>();
  private chars = 0;
  private dropped = false;

  constructor(
    readonly el: HTMLElement,
    private readonly maxChars = MAX_OUTPUT_CHARS,
  ) {}

  clear(): void {
    this.el.replaceChildren();
    this.decoders.clear();
    this.chars = 0;
    this.dropped = false;
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
    this.text(`${this.atLineStart() ? '' : '\n'}[${text}]\n`, 'note');
  }

  private atLineStart(): boolean {
    const t = this.el.lastChild?.textContent ?? '';
    return t === '' || t.endsWith('\n');
  }

  private text(s: string, cls: string): void {
    if (s === '') return;
    const stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - 4;
    const last = this.el.lastChild as HTMLElement | null;
    if (last && last.className === cls && last.firstChild instanceof Text) last.firstChild.appendData(s);
    else {
      const span = document.createElement('span');
      span.className = cls;
      span.textContent = s;
      this.el.append(span);
    }
    this.chars += s.length;
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
      if (!this.dropped) {
        this.dropped = true;
        this.el.dataset.dropped = 'true';
      }
    }
  }
}
