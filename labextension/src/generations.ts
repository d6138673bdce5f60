/**
 * The status dialog's picture: this session's generations on a line, each as wide as it lived (at
 * least wide enough to read), saying when it started, how it ended and why, how many cells it ran
 * and its peak memory. The kernel sends the rows (the klbr comm's `generations`); drawn with the DOM.
 */

import { sizeText } from './logic';

/** One generation, as the kernel's `generations` answer gives it. */
export interface IGeneration {
  number: number;
  placement: string;
  started: string;
  ended: string | null;
  end_reason: string | null;
  memory_peak: number | null;
  cells: number;
}

export function isGenerations(value: unknown): value is IGeneration[] {
  return (
    Array.isArray(value) &&
    value.every(
      g =>
        typeof g === 'object' &&
        g !== null &&
        typeof (g as IGeneration).number === 'number' &&
        typeof (g as IGeneration).started === 'string' &&
        typeof (g as IGeneration).cells === 'number'
    )
  );
}

/** An ISO time as the page's clock shows it (the text itself if it is not one). */
export function clock(iso: string): string {
  const when = new Date(iso);
  return Number.isNaN(when.getTime()) ? iso : when.toLocaleTimeString();
}

/** How a generation ended, in a user's words (the store's reason first: "lost: killed by signal 9"). */
export function endWords(generation: IGeneration): string {
  if (generation.ended === null) {
    return 'serving now';
  }
  const reason = generation.end_reason ?? 'ended';
  const [kind, ...detail] = reason.split(': ');
  const words: Record<string, string> = {
    lost: 'its worker died',
    killed: 'killed: it ignored an interrupt',
    deadline: 'killed: past its deadline',
    restart: 'restarted',
    relocated: 'moved to another placement',
    shutdown: 'the kernel shut down',
    start_failed: 'did not start',
    link_lost: 'its link was lost'
  };
  const said = words[kind] ?? kind;
  return `${said}${detail.length > 0 ? ` (${detail.join(': ')})` : ''} at ${clock(generation.ended)}`;
}

/** The generations on a line, in a node for the dialog. */
export function generationsNode(generations: IGeneration[], now: string): HTMLElement {
  const line = document.createElement('div');
  line.className = 'klbr-Generations';
  const end = Date.parse(now);
  for (const generation of generations) {
    const from = Date.parse(generation.started);
    const to = generation.ended !== null ? Date.parse(generation.ended) : end;
    const lived = Math.max(1, Number.isNaN(to - from) ? 1 : (to - from) / 1000);
    const box = document.createElement('div');
    box.className = 'klbr-Generation';
    box.dataset.klbrServing = String(generation.ended === null);
    box.style.flexGrow = String(lived);
    const peak = generation.memory_peak ? `, peak ${sizeText(generation.memory_peak)}` : '';
    box.textContent = `generation ${generation.number}`;
    const detail = document.createElement('div');
    detail.className = 'klbr-Generation-detail';
    detail.textContent =
      `${generation.placement}, from ${clock(generation.started)}; ${endWords(generation)}; ` +
      `${generation.cells} cell${generation.cells === 1 ? '' : 's'}${peak}`;
    box.appendChild(detail);
    box.title = detail.textContent;
    line.appendChild(box);
  }
  return line;
}
